"""tuner: an auto-tuner for LLM serving settings.

One trial boots a real engine server, finds how much traffic it carries under an SLO (or drives a
workload at one load), and records it in an Optuna study. The tuner's own process imports no
engine: each engine runs from its own Python environment.

What a library user may import is listed in ``__all__``; everything else is internal and may change.

    import tuner
    study = tuner.run_search(tuner.SearchOptions(workload="rag", trials=4), tuner.Progress())
    tuner.export_study(study, None, Path("exports"))
"""

from tuner.deploy.export import export_study
from tuner.errors import TunerError
from tuner.progress import Progress, Quiet
from tuner.search.options import SearchOptions
from tuner.search.run import run_search
from tuner.search.space import Space, load_space
from tuner.version import __version__

__all__ = [
    "Progress",
    "Quiet",
    "SearchOptions",
    "Space",
    "TunerError",
    "__version__",
    "export_study",
    "load_space",
    "run_search",
]
