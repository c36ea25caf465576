"""Dash pages (``dash.register_page``), loaded by ``create_app`` through Dash's
``pages_folder``; import them only after a ``Dash`` app exists."""
