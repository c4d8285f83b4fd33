"""A forkserver preload that changes, at import, the process state a child's set-up fixes:
signal dispositions and mask, faulthandler, the core-file limit. The zygote that imports it
must not pass any of that on to its children."""

import faulthandler
import resource
import signal


def _handler(signum, frame):  # pragma: no cover - never delivered
    pass


signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGHUP, _handler)
signal.signal(signal.SIGPIPE, signal.SIG_DFL)
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
faulthandler.disable()
_soft, _hard = resource.getrlimit(resource.RLIMIT_CORE)
if _hard != 0:  # raise the soft limit where the hard one allows it
    resource.setrlimit(resource.RLIMIT_CORE, (_hard, _hard))
