"""microagent's start of Debian's ipykernel: what `python3 -m
ipykernel_launcher` does, without two parts a code session never uses,
each many hundreds of system calls and page faults at import, which cost
minutes where guest kernel mode is emulated: the debugger (debugpy: some
270 modules and a `uname` process; ipykernel runs without it, saying
"debugging will not be enabled") and jedi's completions (some 100
modules; IPython completes without jedi). Both stay importable by the
session's own code. microagent runs it as `python3 -c THIS -f FILE`.
"""

import sys

# As ipykernel_launcher: the start's directory is not on the path (the
# shell puts the session's own back for the user's code).
if sys.path and sys.path[0] == "":
    del sys.path[0]
sys.modules["debugpy"] = None
sys.modules["jedi"] = None
from ipykernel import ipkernel, kernelapp  # noqa: E402,F401
import IPython.core.completer  # noqa: E402,F401

del sys.modules["debugpy"], sys.modules["jedi"]
kernelapp.launch_new_instance()
