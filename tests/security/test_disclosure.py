"""With keys configured, no answer tells which model names exist: a request without a
valid key gets the same 401 whatever the model, a key that may not use a model the same
404 as an unknown model; /ready shows names only to admins; /metrics (whose labels name
models) needs a server or admin key once models have keys of their own."""

from __future__ import annotations

from typing import Any

import aiohttp

from tests.proxy.harness import harness

DEAD = "http://127.0.0.1:9"
ADMIN = "admin-key-000001"
T1, T2 = "tenant-key-0001", "tenant-key-0002"
MSGS = [{"role": "user", "content": "hi"}]


def _model(name: str, keys: list[str]) -> dict[str, Any]:
    return {
        "name": name,
        "api_keys": keys,
        "pairs": [
            {
                "spec": {
                    "name": f"{name}-s",
                    "url": DEAD,
                    "served_model_name": "x",
                    "method": "ngram",
                    "k": 5,
                },
                "base": {"name": f"{name}-b", "url": DEAD, "served_model_name": "x"},
            }
        ],
    }


async def _chat(
    s: aiohttp.ClientSession, url: str, model: str, key: str | None
) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with s.post(url, json={"model": model, "messages": MSGS}, headers=headers) as r:
        return r.status, await r.json()


async def test_no_key_and_wrong_key_answers_do_not_depend_on_the_model() -> None:
    async with (
        harness(
            server={"admin_keys": [ADMIN]},
            model={"api_keys": [T1]},
            extra_models=[_model("secret-m2", [T2]), _model("open-m3", [])],
        ) as h,
        aiohttp.ClientSession() as s,
    ):
        url = h.url("/v1/chat/completions")
        # No key, or an invalid one: one 401, byte for byte, for a keyed model and an unknown one.
        for key in (None, "not-a-key-at-all"):
            answers = [await _chat(s, url, m, key) for m in ("m1", "secret-m2", "no-such-model")]
            assert {st for st, _ in answers} == {401}, answers
            assert answers[0][1] == answers[1][1] == answers[2][1]
        # The open model (no server keys, no keys of its own) still needs none.
        status, _ = await _chat(s, url, "open-m3", None)
        assert status != 401
        # A valid key for another model: the same 404 as an unknown model (only the
        # requested name differs, echoed back as sent).
        st_other, other = await _chat(s, url, "secret-m2", T1)
        st_unknown, unknown = await _chat(s, url, "zz-unknwn", T1)
        assert st_other == st_unknown == 404
        assert other["error"]["message"].replace("secret-m2", "X") == unknown["error"]["message"].replace(
            "zz-unknwn", "X"
        )
        assert {k: v for k, v in other["error"].items() if k != "message"} == {
            k: v for k, v in unknown["error"].items() if k != "message"
        }
        assert "m1" not in unknown["error"]["message"] and "open-m3" not in unknown["error"]["message"]
        # The key's own model works.
        status, _ = await _chat(s, url, "m1", T1)
        assert status == 200


async def test_ready_and_metrics_name_models_only_for_admins() -> None:
    async with (
        harness(
            server={"admin_keys": [ADMIN]}, model={"api_keys": [T1]}, extra_models=[_model("secret-m2", [T2])]
        ) as h,
        aiohttp.ClientSession() as s,
    ):
        async with s.get(h.url("/ready")) as r:
            text = await r.text()
            assert set((await r.json()).keys()) == {"status"}
            assert "secret-m2" not in text and "m1" not in text
        async with s.get(h.url("/ready"), headers={"Authorization": f"Bearer {T1}"}) as r:
            assert "secret-m2" not in await r.text()  # a tenant key is not an admin key
        async with s.get(h.url("/ready"), headers={"Authorization": f"Bearer {ADMIN}"}) as r:
            assert set((await r.json())["models"]) == {"m1", "secret-m2"}
        # metrics_require_key is unset: models with keys of their own make /metrics need a key.
        for key in (None, T1):
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            async with s.get(h.url("/metrics"), headers=headers) as r:
                assert r.status == 401
                assert "secret-m2" not in await r.text()
        async with s.get(h.url("/metrics"), headers={"Authorization": f"Bearer {ADMIN}"}) as r:
            assert r.status == 200


async def test_without_any_key_names_stay_public() -> None:
    async with harness() as h, aiohttp.ClientSession() as s:
        async with s.get(h.url("/metrics")) as r:
            assert r.status == 200
        async with s.post(h.url("/v1/chat/completions"), json={"model": "zz", "messages": MSGS}) as r:
            assert r.status == 404 and "Known models: m1" in (await r.json())["error"]["message"]
