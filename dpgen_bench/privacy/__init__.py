"""Privacy accounting: noise calibration, composition (Opacus RDP, prv-accountant PRV),
and the ledger that counts every private step a method takes."""

from .accounting import (
    calibrate_noise,
    compose_prv,
    compose_rdp,
    fmt_eps,
    part_epsilon,
    steps_and_noise,
    steps_for_budget,
)
from .ledger import PrivacyLedger
from .signal import dpsgd_noise_to_signal, parameter_count, release_noise_to_signal

__all__ = [
    "calibrate_noise",
    "compose_prv",
    "compose_rdp",
    "fmt_eps",
    "part_epsilon",
    "steps_and_noise",
    "steps_for_budget",
    "PrivacyLedger",
    "dpsgd_noise_to_signal",
    "parameter_count",
    "release_noise_to_signal",
]
