"""Interactive dashboards for the notebooks (ipywidgets + plotly figures redrawn in an Output).

Each public ``*_dashboard()`` can be called with no arguments and returns a ``Dashboard``
(an ipywidgets VBox with ``controls``, ``figures`` and ``refresh()``). The maths they plot
lives in the library (``sazo_lite.variance``, ``sazo_lite.course.problems``, ...), not here.
"""
from ._common import Dashboard

__all__ = ["Dashboard"]
# Each dashboard module adds its import and __all__ entry below.
from .sazo import decay_note, sazo_dashboard, trace_readout
__all__ += ["sazo_dashboard", "trace_readout", "decay_note"]
from .race import race_dashboard, race_figure, race_table_html, race_verdict
__all__ += ["race_dashboard", "race_figure", "race_table_html", "race_verdict"]
from .estimator import dimension_dashboard, epsilon_dashboard, estimator_dashboard
__all__ += ["estimator_dashboard", "epsilon_dashboard", "dimension_dashboard"]
from .mezo import memory_figure, mezo_dashboard
__all__ += ["memory_figure", "mezo_dashboard"]
from .importance import batch_gain_dashboard, gain_over_training_figure, importance_dashboard, unbiased_dashboard
__all__ += ["importance_dashboard", "unbiased_dashboard", "batch_gain_dashboard", "gain_over_training_figure"]
from .memory import measured_vs_predicted_figure, memory_dashboard
__all__ += ["memory_dashboard", "measured_vs_predicted_figure"]
from .pictures import batch_bars_dashboard, chi2_dashboard, norms_histogram_dashboard, paths_dashboard
__all__ += ["norms_histogram_dashboard", "batch_bars_dashboard", "chi2_dashboard", "paths_dashboard"]
