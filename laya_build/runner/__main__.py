"""``python -m laya_build.runner``: a stage process (a request on stdin) or, with ``--server``, a fork server."""

import sys

from laya_build.runner import _main

sys.exit(_main())
