"""Three regions on one machine as a real NATS supercluster (one server per region,
joined by gateways): each region's coordinator, fleet and job log stay its own (its
streams are placed in its cluster), a message crosses the gateways, and losing one
region's server leaves the others serving."""

from __future__ import annotations

from mesh import subjects

from .conftest import eventually


def job(name: str) -> dict:
    return {"name": name, "tasks": [{"role": "w", "count": 1, "simulate": {"duration": "0.2s"}}]}


async def test_three_regions_each_keep_their_own_log_and_survive_one_lost(regions):
    fed = await regions("eu", "us", "ap")
    for r in fed.values():
        await r.coordinator(f"{r.name}-c1")
        await r.fleet(2, prefix=f"{r.name}-n")
    for r in fed.values():
        await r.ready(2)
    ids = {name: await r.client.submit(job(f"in-{name}")) for name, r in fed.items()}
    for name, r in fed.items():
        done = await r.client.wait(ids[name], timeout=30)
        assert done["state"] == "SUCCEEDED"
        assert {t["node_id"][:2] for t in done["task_list"]} == {name[:2]}
        info = await r.nc.jetstream().stream_info(subjects.log_stream(name))
        assert info.cluster.name == name  # the region's log lives in its own cluster
    # each region's API answers for its own region only, from anywhere in the mesh
    other = fed["eu"].client.__class__(fed["eu"].nc, region="us")
    assert (await other.job(ids["us"]))["name"] == "in-us"

    fed["ap"].server.kill()  # the region's server dies: the others keep serving
    for name in ("eu", "us"):
        j = await fed[name].client.submit(job(f"after-{name}"), retries=20)
        assert (await fed[name].client.wait(j, timeout=30))["state"] == "SUCCEEDED"

    async def no_ap():
        try:
            await other.__class__(fed["eu"].nc, region="ap", timeout=1.0).cluster_info()
            return False
        except Exception:
            return True

    await eventually(no_ap, timeout=10)
