"""tuiprof's Python startup hook, put first on PYTHONPATH by `tuiprof run`.

It only installs the lazy hooks of ``tuiprof_startup`` (nothing is imported
eagerly, torch least of all) and then runs the ``sitecustomize`` this one
shadows, if the environment has one, so existing site customisation keeps
working.
"""

import tuiprof_startup

tuiprof_startup.install()
tuiprof_startup.chain_sitecustomize(__file__)
