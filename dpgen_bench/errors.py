"""Errors a user can cause. The CLI prints them as one line and exits with code 2."""


class UserError(Exception):
    """A mistake in the user's input (flag, name, file, budget): one clear line, no traceback."""


class BudgetTooLow(UserError, ValueError):
    """No noise is large enough for the target ε (the calibration gave up): the plan is infeasible."""


class PrivacyViolation(RuntimeError):
    """A method spent more privacy than it was granted. Never caught silently."""


class Interrupted(Exception):
    """The run was stopped by a signal after writing a checkpoint."""


class SettingOutOfRange(UserError, ValueError):
    """A method setting outside the range its ``Hparams`` declares (``dpgen_bench.settings``):
    a user error on the command line, a ValueError where code builds the settings."""
