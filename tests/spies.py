"""Test doubles shared by the unit tests."""


def recording(cls):
    """A subclass of the gradient hook ``cls`` (a sanitiser called on a gradient) that keeps
    what the hook received (``received``) and returned (``returned``)."""

    class Recording(cls):
        def __call__(self, grad):
            self.received = grad.detach().clone()
            out = super().__call__(grad)
            self.returned = out.detach().clone()
            return out

    Recording.__name__ = f"Recording{cls.__name__}"
    return Recording
