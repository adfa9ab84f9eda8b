"""The directory `tuiprof run` puts first on PYTHONPATH (its sitecustomize.py
and tuiprof_startup.py are imported top-level by the job's Python)."""
