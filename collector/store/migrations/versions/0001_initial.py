"""The schema as it was before migrations existed (what ``create_all`` made).

A database made then is stamped with this revision instead of running it.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

# Frozen copies of the types of the time: later changes to ``schema.py`` must not
# change what this revision creates.
ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
JSONDoc = sa.JSON(none_as_null=True)


def upgrade() -> None:
    _create_detector_streaks()
    _create_findings()
    _create_recommendations()
    _create_rollup_marks()
    _create_targets()
    _create_device_rollups()
    _create_device_samples()
    _create_model_configs()
    _create_models()
    _create_process_samples()
    _create_server_samples()
    _create_target_transitions()
    _create_model_rollups()
    _create_model_samples()
    _create_batch_stats()


def _create_detector_streaks() -> None:
    op.create_table(
        "detector_streaks",
        sa.Column("id", ID, nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("target", sa.Text(), nullable=False),
        sa.Column("subject", sa.Text(), nullable=False),
        sa.Column("holding", sa.Integer(), nullable=False),
        sa.Column("clearing", sa.Integer(), nullable=False),
        sa.Column("since", sa.Float(), nullable=True),
        sa.Column("evaluated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_detector_streaks")),
        sa.UniqueConstraint(
            "kind", "target", "subject", name=op.f("uq_detector_streaks_kind_target_subject")
        ),
    )


def _create_findings() -> None:
    op.create_table(
        "findings",
        sa.Column("id", ID, nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("severity", sa.Text(), nullable=False),
        sa.Column("target", sa.Text(), nullable=False),
        sa.Column("subject", sa.Text(), nullable=False),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column("window_start", sa.Float(), nullable=False),
        sa.Column("window_end", sa.Float(), nullable=False),
        sa.Column("evidence", JSONDoc, nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("resolved_at", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_findings")),
    )
    op.create_index(
        op.f("ix_findings_target_created_at"), "findings", ["target", "created_at"], unique=False
    )


def _create_recommendations() -> None:
    op.create_table(
        "recommendations",
        sa.Column("id", ID, nullable=False),
        sa.Column("target", sa.Text(), nullable=False),
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("change", JSONDoc, nullable=False),
        sa.Column("predicted", JSONDoc, nullable=False),
        sa.Column("confidence", sa.Float(), nullable=False),
        sa.Column("config_fragment", sa.Text(), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("applied_at", sa.Float(), nullable=True),
        sa.Column("verification", JSONDoc, nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_recommendations")),
    )
    op.create_index(
        op.f("ix_recommendations_target_model_created_at"),
        "recommendations",
        ["target", "model", "created_at"],
        unique=False,
    )


def _create_rollup_marks() -> None:
    op.create_table(
        "rollup_marks",
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("bucket_s", sa.Float(), nullable=False),
        sa.Column("rolled_until", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("kind", "bucket_s", name=op.f("pk_rollup_marks")),
    )


def _create_targets() -> None:
    op.create_table(
        "targets",
        sa.Column("id", ID, nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("up", sa.Boolean(), nullable=True),
        sa.Column("last_error_kind", sa.Text(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("last_seen_at", sa.Float(), nullable=True),
        sa.Column("last_scrape_at", sa.Float(), nullable=True),
        sa.Column("last_duration_s", sa.Float(), nullable=True),
        sa.Column("consecutive_failures", sa.Integer(), nullable=False),
        sa.Column("server_version", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_targets")),
        sa.UniqueConstraint("name", name=op.f("uq_targets_name")),
    )


def _create_device_rollups() -> None:
    op.create_table(
        "device_rollups",
        sa.Column("id", ID, nullable=False),
        sa.Column("target_id", ID, nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("uuid", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("bucket_start", sa.Float(), nullable=False),
        sa.Column("bucket_s", sa.Float(), nullable=False),
        sa.Column("sample_count", sa.Integer(), nullable=False),
        sa.Column("utilization_gpu_pct", sa.Float(), nullable=True),
        sa.Column("utilization_memory_pct", sa.Float(), nullable=True),
        sa.Column("sm_active_pct", sa.Float(), nullable=True),
        sa.Column("sm_occupancy_pct", sa.Float(), nullable=True),
        sa.Column("tensor_active_pct", sa.Float(), nullable=True),
        sa.Column("memory_used_bytes", sa.Float(), nullable=True),
        sa.Column("power_w", sa.Float(), nullable=True),
        sa.Column("utilization_gpu_pct_max", sa.Float(), nullable=True),
        sa.Column("sm_active_pct_max", sa.Float(), nullable=True),
        sa.Column("memory_used_bytes_max", sa.BigInteger(), nullable=True),
        sa.Column("power_w_max", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(
            ["target_id"], ["targets.id"], name=op.f("fk_device_rollups_target_id_targets")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_device_rollups")),
        sa.UniqueConstraint(
            "bucket_s",
            "bucket_start",
            "target_id",
            "source",
            "uuid",
            name=op.f("uq_device_rollups_bucket_s_bucket_start_target_id_source_uuid"),
        ),
    )
    op.create_index(
        op.f("ix_device_rollups_target_id_bucket_start"),
        "device_rollups",
        ["target_id", "bucket_start"],
        unique=False,
    )


def _create_device_samples() -> None:
    op.create_table(
        "device_samples",
        sa.Column("id", ID, nullable=False),
        sa.Column("target_id", ID, nullable=False),
        sa.Column("collected_at", sa.Float(), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("uuid", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("device_index", sa.Integer(), nullable=True),
        sa.Column("device_name", sa.Text(), nullable=True),
        sa.Column("parent_uuid", sa.Text(), nullable=True),
        sa.Column("gpu_instance_id", sa.Integer(), nullable=True),
        sa.Column("compute_instance_id", sa.Integer(), nullable=True),
        sa.Column("utilization_gpu_pct", sa.Float(), nullable=True),
        sa.Column("utilization_memory_pct", sa.Float(), nullable=True),
        sa.Column("memory_used_bytes", sa.BigInteger(), nullable=True),
        sa.Column("memory_total_bytes", sa.BigInteger(), nullable=True),
        sa.Column("power_w", sa.Float(), nullable=True),
        sa.Column("power_limit_w", sa.Float(), nullable=True),
        sa.Column("energy_j", sa.Float(), nullable=True),
        sa.Column("sm_clock_mhz", sa.Integer(), nullable=True),
        sa.Column("sm_active_pct", sa.Float(), nullable=True),
        sa.Column("sm_occupancy_pct", sa.Float(), nullable=True),
        sa.Column("tensor_active_pct", sa.Float(), nullable=True),
        sa.Column("healthy", sa.Boolean(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["target_id"], ["targets.id"], name=op.f("fk_device_samples_target_id_targets")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_device_samples")),
    )
    op.create_index(
        op.f("ix_device_samples_collected_at"), "device_samples", ["collected_at"], unique=False
    )
    op.create_index(
        op.f("ix_device_samples_target_id_collected_at"),
        "device_samples",
        ["target_id", "collected_at"],
        unique=False,
    )


def _create_model_configs() -> None:
    op.create_table(
        "model_configs",
        sa.Column("id", ID, nullable=False),
        sa.Column("target_id", ID, nullable=False),
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("collected_at", sa.Float(), nullable=False),
        sa.Column("max_batch_size", sa.Integer(), nullable=False),
        sa.Column("dynamic_batching", sa.Boolean(), nullable=False),
        sa.Column("preferred_batch_sizes", JSONDoc, nullable=False),
        sa.Column("max_queue_delay_us", sa.BigInteger(), nullable=False),
        sa.Column("priority_levels", sa.Integer(), nullable=False),
        sa.Column("default_queue_policy", JSONDoc, nullable=True),
        sa.Column("instance_count", sa.Integer(), nullable=False),
        sa.Column("instance_kind", sa.Text(), nullable=False),
        sa.Column("backend", sa.Text(), nullable=True),
        sa.Column("platform", sa.Text(), nullable=True),
        sa.Column("raw_json", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["target_id"], ["targets.id"], name=op.f("fk_model_configs_target_id_targets")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_model_configs")),
    )
    op.create_index(
        op.f("ix_model_configs_target_id_model_id"),
        "model_configs",
        ["target_id", "model", "id"],
        unique=False,
    )


def _create_models() -> None:
    op.create_table(
        "models",
        sa.Column("id", ID, nullable=False),
        sa.Column("target_id", ID, nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("version", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["target_id"], ["targets.id"], name=op.f("fk_models_target_id_targets")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_models")),
        sa.UniqueConstraint(
            "target_id", "name", "version", name=op.f("uq_models_target_id_name_version")
        ),
    )


def _create_process_samples() -> None:
    op.create_table(
        "process_samples",
        sa.Column("id", ID, nullable=False),
        sa.Column("target_id", ID, nullable=False),
        sa.Column("collected_at", sa.Float(), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("pid", sa.BigInteger(), nullable=False),
        sa.Column("role", sa.Text(), nullable=False),
        sa.Column("model", sa.Text(), nullable=True),
        sa.Column("instance_name", sa.Text(), nullable=True),
        sa.Column("cpu_pct", sa.Float(), nullable=True),
        sa.Column("rss_bytes", sa.BigInteger(), nullable=True),
        sa.Column("gpu_uuid", sa.Text(), nullable=True),
        sa.Column("sm_util_pct", sa.Float(), nullable=True),
        sa.Column("mem_util_pct", sa.Float(), nullable=True),
        sa.Column("gpu_memory_bytes", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(
            ["target_id"], ["targets.id"], name=op.f("fk_process_samples_target_id_targets")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_process_samples")),
    )
    op.create_index(
        op.f("ix_process_samples_collected_at"), "process_samples", ["collected_at"], unique=False
    )
    op.create_index(
        op.f("ix_process_samples_target_id_collected_at"),
        "process_samples",
        ["target_id", "collected_at"],
        unique=False,
    )


def _create_server_samples() -> None:
    op.create_table(
        "server_samples",
        sa.Column("id", ID, nullable=False),
        sa.Column("target_id", ID, nullable=False),
        sa.Column("collected_at", sa.Float(), nullable=False),
        sa.Column("cpu_utilization", sa.Float(), nullable=True),
        sa.Column("cpu_memory_total_bytes", sa.Float(), nullable=True),
        sa.Column("cpu_memory_used_bytes", sa.Float(), nullable=True),
        sa.Column("pinned_memory_pool_total_bytes", sa.Float(), nullable=True),
        sa.Column("pinned_memory_pool_used_bytes", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(
            ["target_id"], ["targets.id"], name=op.f("fk_server_samples_target_id_targets")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_server_samples")),
    )
    op.create_index(
        op.f("ix_server_samples_collected_at"), "server_samples", ["collected_at"], unique=False
    )
    op.create_index(
        op.f("ix_server_samples_target_id_collected_at"),
        "server_samples",
        ["target_id", "collected_at"],
        unique=False,
    )


def _create_target_transitions() -> None:
    op.create_table(
        "target_transitions",
        sa.Column("id", ID, nullable=False),
        sa.Column("target_id", ID, nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("up", sa.Boolean(), nullable=False),
        sa.Column("error_kind", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["target_id"], ["targets.id"], name=op.f("fk_target_transitions_target_id_targets")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_target_transitions")),
    )
    op.create_index(
        op.f("ix_target_transitions_target_id_source_id"),
        "target_transitions",
        ["target_id", "source", "id"],
        unique=False,
    )


def _create_model_rollups() -> None:
    op.create_table(
        "model_rollups",
        sa.Column("id", ID, nullable=False),
        sa.Column("model_id", ID, nullable=False),
        sa.Column("bucket_start", sa.Float(), nullable=False),
        sa.Column("bucket_s", sa.Float(), nullable=False),
        sa.Column("sample_count", sa.Integer(), nullable=False),
        sa.Column("rated_count", sa.Integer(), nullable=False),
        sa.Column("rated_s", sa.Float(), nullable=False),
        sa.Column("requests_per_s", sa.Float(), nullable=True),
        sa.Column("inferences_per_s", sa.Float(), nullable=True),
        sa.Column("executions_per_s", sa.Float(), nullable=True),
        sa.Column("fail_per_s", sa.Float(), nullable=True),
        sa.Column("avg_batch_size", sa.Float(), nullable=True),
        sa.Column("queue_us_per_request", sa.Float(), nullable=True),
        sa.Column("compute_input_us_per_request", sa.Float(), nullable=True),
        sa.Column("compute_infer_us_per_request", sa.Float(), nullable=True),
        sa.Column("compute_output_us_per_request", sa.Float(), nullable=True),
        sa.Column("request_us_per_request", sa.Float(), nullable=True),
        sa.Column("queue_share", sa.Float(), nullable=True),
        sa.Column("busy_share", sa.Float(), nullable=True),
        sa.Column("pending_request_count", sa.Float(), nullable=True),
        sa.Column("requests_per_s_max", sa.Float(), nullable=True),
        sa.Column("avg_batch_size_max", sa.Float(), nullable=True),
        sa.Column("queue_us_per_request_max", sa.Float(), nullable=True),
        sa.Column("request_us_per_request_max", sa.Float(), nullable=True),
        sa.Column("queue_share_max", sa.Float(), nullable=True),
        sa.Column("busy_share_max", sa.Float(), nullable=True),
        sa.Column("pending_request_count_max", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(
            ["model_id"], ["models.id"], name=op.f("fk_model_rollups_model_id_models")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_model_rollups")),
        sa.UniqueConstraint(
            "bucket_s",
            "bucket_start",
            "model_id",
            name=op.f("uq_model_rollups_bucket_s_bucket_start_model_id"),
        ),
    )
    op.create_index(
        op.f("ix_model_rollups_model_id_bucket_start"),
        "model_rollups",
        ["model_id", "bucket_start"],
        unique=False,
    )


def _create_model_samples() -> None:
    op.create_table(
        "model_samples",
        sa.Column("id", ID, nullable=False),
        sa.Column("model_id", ID, nullable=False),
        sa.Column("collected_at", sa.Float(), nullable=False),
        sa.Column("request_success", sa.Float(), nullable=False),
        sa.Column("request_failure_by_reason", JSONDoc, nullable=False),
        sa.Column("inference_count", sa.Float(), nullable=False),
        sa.Column("exec_count", sa.Float(), nullable=False),
        sa.Column("request_duration_us", sa.Float(), nullable=False),
        sa.Column("queue_duration_us", sa.Float(), nullable=False),
        sa.Column("compute_input_duration_us", sa.Float(), nullable=False),
        sa.Column("compute_infer_duration_us", sa.Float(), nullable=False),
        sa.Column("compute_output_duration_us", sa.Float(), nullable=False),
        sa.Column("pending_request_count", sa.Float(), nullable=True),
        sa.Column("cache_hit_count", sa.Float(), nullable=True),
        sa.Column("cache_miss_count", sa.Float(), nullable=True),
        sa.Column("cache_hit_duration_us", sa.Float(), nullable=True),
        sa.Column("cache_miss_duration_us", sa.Float(), nullable=True),
        sa.Column("load_duration_s", sa.Float(), nullable=True),
        sa.Column("summary_quantiles_us", JSONDoc, nullable=False),
        sa.Column("histogram_buckets", JSONDoc, nullable=True),
        sa.Column("stats_last_inference_ms", sa.BigInteger(), nullable=True),
        sa.Column("stats_inference_count", sa.BigInteger(), nullable=True),
        sa.Column("stats_execution_count", sa.BigInteger(), nullable=True),
        sa.Column("stats_success_count", sa.BigInteger(), nullable=True),
        sa.Column("stats_success_ns", sa.BigInteger(), nullable=True),
        sa.Column("stats_fail_count", sa.BigInteger(), nullable=True),
        sa.Column("stats_fail_ns", sa.BigInteger(), nullable=True),
        sa.Column("stats_queue_count", sa.BigInteger(), nullable=True),
        sa.Column("stats_queue_ns", sa.BigInteger(), nullable=True),
        sa.Column("stats_compute_input_count", sa.BigInteger(), nullable=True),
        sa.Column("stats_compute_input_ns", sa.BigInteger(), nullable=True),
        sa.Column("stats_compute_infer_count", sa.BigInteger(), nullable=True),
        sa.Column("stats_compute_infer_ns", sa.BigInteger(), nullable=True),
        sa.Column("stats_compute_output_count", sa.BigInteger(), nullable=True),
        sa.Column("stats_compute_output_ns", sa.BigInteger(), nullable=True),
        sa.Column("stats_cache_hit_count", sa.BigInteger(), nullable=True),
        sa.Column("stats_cache_hit_ns", sa.BigInteger(), nullable=True),
        sa.Column("stats_cache_miss_count", sa.BigInteger(), nullable=True),
        sa.Column("stats_cache_miss_ns", sa.BigInteger(), nullable=True),
        sa.Column("rate_window_s", sa.Float(), nullable=True),
        sa.Column("requests_per_s", sa.Float(), nullable=True),
        sa.Column("inferences_per_s", sa.Float(), nullable=True),
        sa.Column("executions_per_s", sa.Float(), nullable=True),
        sa.Column("fail_per_s", sa.Float(), nullable=True),
        sa.Column("fail_per_s_by_reason", JSONDoc, nullable=True),
        sa.Column("avg_batch_size", sa.Float(), nullable=True),
        sa.Column("queue_us_per_request", sa.Float(), nullable=True),
        sa.Column("compute_input_us_per_request", sa.Float(), nullable=True),
        sa.Column("compute_infer_us_per_request", sa.Float(), nullable=True),
        sa.Column("compute_output_us_per_request", sa.Float(), nullable=True),
        sa.Column("request_us_per_request", sa.Float(), nullable=True),
        sa.Column("queue_share", sa.Float(), nullable=True),
        sa.Column("busy_share", sa.Float(), nullable=True),
        sa.Column("rate_resets", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(
            ["model_id"], ["models.id"], name=op.f("fk_model_samples_model_id_models")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_model_samples")),
    )
    op.create_index(
        op.f("ix_model_samples_collected_at"), "model_samples", ["collected_at"], unique=False
    )
    op.create_index(
        op.f("ix_model_samples_model_id_collected_at"),
        "model_samples",
        ["model_id", "collected_at"],
        unique=False,
    )


def _create_batch_stats() -> None:
    op.create_table(
        "batch_stats",
        sa.Column("id", ID, nullable=False),
        sa.Column("model_sample_id", ID, nullable=False),
        sa.Column("batch_size", sa.Integer(), nullable=False),
        sa.Column("exec_count", sa.BigInteger(), nullable=False),
        sa.Column("compute_input_count", sa.BigInteger(), nullable=False),
        sa.Column("compute_input_ns", sa.BigInteger(), nullable=False),
        sa.Column("compute_infer_ns", sa.BigInteger(), nullable=False),
        sa.Column("compute_output_count", sa.BigInteger(), nullable=False),
        sa.Column("compute_output_ns", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["model_sample_id"],
            ["model_samples.id"],
            name=op.f("fk_batch_stats_model_sample_id_model_samples"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_batch_stats")),
    )
    op.create_index(
        op.f("ix_batch_stats_model_sample_id"), "batch_stats", ["model_sample_id"], unique=False
    )


def downgrade() -> None:
    for table in (
        "batch_stats",
        "model_rollups",
        "model_samples",
        "model_configs",
        "device_rollups",
        "device_samples",
        "process_samples",
        "server_samples",
        "target_transitions",
        "models",
        "targets",
        "rollup_marks",
        "recommendations",
        "findings",
        "detector_streaks",
    ):
        op.drop_table(table)
