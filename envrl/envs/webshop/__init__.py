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
