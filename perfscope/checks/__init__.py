"""Performance assertions: the metric grammar (:mod:`.grammar`), ``expect``/``check``
(:mod:`.expect`) and change detection between run sets (:mod:`.change`).

The public names are re-exported by :mod:`perfscope`; import them from there.
"""
