"""Login, roles and the settings behind them, through Flask's test client on the
real app (no browser)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from collector.config import UiSettings, load_settings
from collector.errors import ConfigError
from collector.store import Store
from dashboard.app import create_app
from dashboard.auth import ADMIN, VIEWER, open_role

ADMIN_PW = "a-long-admin-password"
VIEWER_PW = "a-long-viewer-password"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store(f"sqlite:///{tmp_path}/a.db") as s:
        yield s


@pytest.fixture
def client(store: Store):  # type: ignore[no-untyped-def]
    app = create_app(store, ui=UiSettings(admin_password=ADMIN_PW, viewer_password=VIEWER_PW))
    return app.server.test_client()


def test_every_page_and_callback_needs_a_login(client) -> None:  # type: ignore[no-untyped-def]
    page = client.get("/recommendations?model=x")
    assert page.status_code == 302
    assert page.headers["Location"].startswith("/login?next=%2Frecommendations%3Fmodel%3Dx")
    assert client.get("/_dash-layout").status_code == 401
    assert client.post("/_dash-update-component", json={}).status_code == 401
    # The login form and its stylesheet are reachable.
    assert client.get("/login").status_code == 200
    assert client.get("/assets/style.css").status_code == 200


def test_a_wrong_password_is_refused_and_never_echoed(client) -> None:  # type: ignore[no-untyped-def]
    response = client.post("/login", data={"password": "guess", "next": "/"})
    assert response.status_code == 401
    body = response.get_data(as_text=True)
    assert "Wrong password" in body and "guess" not in body
    assert ADMIN_PW not in body and VIEWER_PW not in body
    assert client.get("/").status_code == 302


@pytest.mark.parametrize("password,role", [(ADMIN_PW, ADMIN), (VIEWER_PW, VIEWER)])
def test_each_password_signs_in_its_role(client, password: str, role: str) -> None:  # type: ignore[no-untyped-def]
    response = client.post("/login", data={"password": password, "next": "/findings"})
    assert response.status_code == 302 and response.headers["Location"] == "/findings"
    page = client.get("/findings")
    assert page.status_code == 200
    layout = client.get("/_dash-layout").get_data(as_text=True)
    assert f'"children": "{role}"' in layout or f'"children":"{role}"' in layout
    assert ADMIN_PW not in layout and VIEWER_PW not in layout
    client.post("/logout")  # signing out is a POST (a GET offers the button)
    assert client.get("/findings").status_code == 302


def test_next_never_leaves_the_app(client) -> None:  # type: ignore[no-untyped-def]
    for hostile in ("https://evil.example/", "//evil.example/x", "javascript:alert(1)"):
        response = client.post("/login", data={"password": ADMIN_PW, "next": hostile})
        assert response.headers["Location"] == "/"
    page = client.get("/login?next=%22%3E%3Cscript%3Ealert(1)%3C/script%3E")
    assert "<script>alert(1)" not in page.get_data(as_text=True)


def test_a_bearer_token_serves_scripts(client) -> None:  # type: ignore[no-untyped-def]
    assert (
        client.get("/_dash-layout", headers={"Authorization": f"Bearer {VIEWER_PW}"}).status_code
        == 200
    )
    assert client.get("/_dash-layout", headers={"Authorization": "Bearer nope"}).status_code == 401


def test_without_a_password_the_bind_address_decides(store: Store) -> None:
    assert open_role("127.0.0.1") == ADMIN
    assert open_role("::1") == ADMIN
    assert open_role("localhost") == ADMIN
    assert open_role("0.0.0.0") == VIEWER
    assert open_role("10.1.2.3") == VIEWER
    app = create_app(store, host="0.0.0.0")
    client = app.server.test_client()
    assert client.get("/").status_code == 200
    assert '"viewer"' in client.get("/_dash-layout").get_data(as_text=True)


def test_ui_settings_are_validated_and_read_from_the_environment() -> None:
    settings = load_settings(
        env={"BATCHSCOPE_UI_ADMIN_PASSWORD": "x1", "BATCHSCOPE_UI_APPLY_VERIFY_S": "5"}
    )
    assert settings.ui.admin_password is not None
    assert settings.ui.admin_password.get_secret_value() == "x1" and settings.ui.login_required
    assert settings.ui.apply_verify_s == 5.0
    assert "x1" not in repr(settings)
    # Printed, dumped to Python or JSON: the passwords and the session key are masked.
    ui = load_settings(
        overrides={
            "ui": {"admin_password": "a-pw-1", "viewer_password": "v-pw-2", "secret_key": "k-3"}
        }
    ).ui
    shown = [str(ui), repr(ui), str(ui.model_dump()), ui.model_dump_json(), str(vars(ui))]
    for text in shown:
        assert not any(secret in text for secret in ("a-pw-1", "v-pw-2", "k-3")), text
    with pytest.raises(ConfigError, match=r"ui\.apply_verify_s"):
        load_settings(env={"BATCHSCOPE_UI_APPLY_VERIFY_S": "-1"})
    with pytest.raises(ConfigError, match=r"ui\.viewer_password"):
        load_settings(overrides={"ui": {"admin_password": "same", "viewer_password": "same"}})
    with pytest.raises(ConfigError, match=r"ui\.colour"):
        load_settings(overrides={"ui": {"colour": "red"}})
    assert not load_settings(env={}).ui.login_required
