"""Batching recommendations from live traffic: observe, fit, simulate, search.

1. **Observe** a window of one model from the store: rates, the effective config, the
   batch_stats increases (the service time per executed batch size), the CPU its
   instances used, and Triton's server-side p95 when summaries are enabled.
2. **Fit** the service time per batch size (``fit.fit_service_time``). With only batch
   size 1 observed the slope is unknown; then the recommendation is a *probe*:
   ``dynamic_batching`` with no delay, which only groups requests already waiting, so
   it adds no waiting of its own, and it produces the batch sizes the next fit needs.
3. **Model the load**. When the server holds several requests at once and queues them
   (a saturated closed loop: clients wait for answers), the load is a population of
   ``N`` clients (Little's law: the mean number of requests in the server, ``L = Σ
   request time / window``, rounded up at the busiest point of the look-back) whose
   own time per request is ``Z = (N − L) / λ``. Clients answer the responses of one
   batch through a shared serial station (an event loop, a sender thread), so the next
   requests return staggered; how much of ``Z`` is serial cannot be seen while one
   instance is saturated, so the model is calibrated for several serial shares
   (``client_serial_shares``) and every prediction is their mean. Each client's own
   time varies (``client_think_cv``): with clockwork clients every delay long enough
   to fill a preferred batch looks the same, and the shortest would win a tie that
   real traffic breaks in favour of waiting. Otherwise the load is open: arrivals at
   the observed rate with the observed burstiness.
4. **Search** candidate configs (delay × preferred sizes × instance count) through the
   discrete-event model of Triton's batcher (``batcher_sim.simulate``), coarse to
   fine (a coarse grid screened with short runs, refined around the best, finalists
   run paired on every variant and seed) and keep the one with the most throughput
   whose p95 meets the objective: ``slo_p95_ms`` when given, else at most 10 % above
   the current config's p95.
5. **Hold still** (``choice``): a config replaces the standing one (the
   recommendation already stored for the running config, else the running one) only
   when its predicted gain exceeds the uncertainty of that gain — the spread of
   paired runs across variants, seeds and earlier windows, and the fit's standard
   error; ties go to the standing config, then to the simpler one. The stored
   recommendation is reused without any simulation while its inputs still hold
   (``cache``), and only fresh samples are advised on (``observe``). Seeds are
   fixed: the same inputs give the same advice.

Predictions are for the observed load, as a client would see them: for closed loops
the simulated client-side latency of each request (server time plus its own client
time), so the p95 carries the stagger too.

Modules: ``observe`` (store reads into a ``ModelHistory``, pure reduction to an
``Observation``), ``model`` (the calibrated ``BatcherModel``), ``search`` (the
recommendation), ``choice`` (the comparison rule), ``cache`` (the standing
recommendation, reused), ``figures`` (the one current figure and gain every view
shows: ``recommendation_figures``), ``job`` (per model and as a scheduler analysis),
``settings``.
"""

from __future__ import annotations

from collector.analysis.recommend.figures import (
    GainFigures,
    gain_figures,
    recommendation_figures,
)
from collector.analysis.recommend.job import (
    recommend_model,
    recommendation_from_dict,
    recommendation_to_dict,
    recommender_job,
    store_recommendation,
)
from collector.analysis.recommend.model import BatcherModel, BatcherVariant, batcher_model
from collector.analysis.recommend.observe import (
    ModelHistory,
    Observation,
    observation_from,
    observe_model,
    observe_windows,
    read_history,
)
from collector.analysis.recommend.search import recommend_from_observation
from collector.analysis.recommend.settings import RecommendSettings

__all__ = [
    "BatcherModel",
    "BatcherVariant",
    "GainFigures",
    "ModelHistory",
    "Observation",
    "RecommendSettings",
    "batcher_model",
    "gain_figures",
    "observation_from",
    "observe_model",
    "observe_windows",
    "read_history",
    "recommend_from_observation",
    "recommend_model",
    "recommendation_figures",
    "recommendation_from_dict",
    "recommendation_to_dict",
    "recommender_job",
    "store_recommendation",
]
