"""batchscope's bundled Grafana dashboards: the generator (``grafana.dashgen``), the
generated JSON (``grafana/dashboards``) and provisioning files ready to mount."""
