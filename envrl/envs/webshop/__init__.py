"""WebShop (Yao et al., 2022): a shopping site, its goals and its reward, runnable offline.

How the pieces fit (each module has one job):

* ``catalog.py``   products in the engine's schema, read from the official files (``$WEBSHOP_DATA``)
                   or from the built-in catalog; one seeded price per product.
* ``builtin.py``   the built-in catalog, generated deterministically in the official raw format.
* ``goals.py``     goals (human or synthetic), seeded price bounds, a fixed order, and the splits.
* ``search.py``    BM25 (bm25s) over title, description, bullet points and options, cached on disk.
* ``reward.py``    the paper's reward, component by component.
* ``store.py``     ``WebShopStore``: catalog + goals + search + reward, loaded once per process.
* ``site.py``      the Flask site (routes and templates of the original page flow).
* ``page.py``      a page's HTML -> the agent's observation and the clickables.
* ``env.py``       the Gymnasium env; ``transports.py`` reaches the site in-process, over HTTP or
                   through a real browser.
* ``server.py``    ``envrl webshop serve``: the site under gunicorn, with a health endpoint.
"""

from envrl.envs.descriptor import ContractTask, EnvDescriptor

DESCRIPTORS = (
    EnvDescriptor(
        name="webshop",
        env_id="envrl/WebShop-v0",
        entry_point="envrl.envs.webshop.env:WebShopEnv",
        max_episode_steps=15,
        split_kinds={"train": "ID", "eval": "ID", "test": "ID", "test_ood": "OOD"},
        example_action="search[red running shoes]",
        tool_intro=(
            "You are shopping on a web store for a customer. Call search with keywords where the page has a "
            "search bar, and click with a button, product or option exactly as it is listed. The episode ends "
            "when you click Buy Now."
        ),
        contract_task=ContractTask(split="test", task_id="fixed_0"),
        engine_packages=("flask", "bm25s", "rapidfuzz"),
        corpus_tasks=8,
    ),
)
