"""forecaster: a GRU that forecasts the next values of a noisy seasonal series, a Lightning project never baked."""

from .data import SineWaves
from .model import Forecaster

__all__ = ["Forecaster", "SineWaves"]
