"""batchscope: the collector, its store, analyses, exporter and alerts."""

import os

# batchscope forks only to exec (a Triton, its model stubs, a simulated fleet), never to
# use gRPC in the child. gRPC's fork handlers, on by default, crashed such a child
# (SIGSEGV before its exec) when the fork came while the load generator's calls were
# in flight: 131 of 300 forks in one measurement, none with them off. Set before any
# module imports gRPC; a value the caller set is kept.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
