"""A reading worker of the run index (``python -m perfscope.profiler.run_index``).

A refresh that reads many runs starts one per core (``_read_runs``): it reads the share of
runs pickled on its stdin and writes their rows to its stdout as one Arrow stream
(``_worker_main``). Nothing else runs this package as a program.
"""

from perfscope.profiler.run_index.scan import _worker_main

if __name__ == "__main__":
    _worker_main()
