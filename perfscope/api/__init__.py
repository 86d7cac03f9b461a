"""The library calls behind the front door: plan and run (:mod:`.run`, :mod:`.runner`),
repeats and run sets (:mod:`.repeat`, :mod:`.runset`), results (:mod:`.results`), studies
(:mod:`.study`), the manual API (:mod:`.manual`), stored-run analysis and the run index.

The public names are re-exported by :mod:`perfscope`; import them from there.
"""
