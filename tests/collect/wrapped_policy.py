"""A policy that hands every call to an inner policy: tests subclass it to change `act` alone
(fail at a step, kill a browser, hold a batch, signal the first step)."""


class WrappedPolicy:
    """Forwards act / reflect / stats / close to `inner` and takes its name."""

    def __init__(self, inner):
        self.inner, self.name = inner, inner.name

    def act(self, contexts):
        return self.inner.act(contexts)

    def reflect(self, request):
        return self.inner.reflect(request)

    def stats(self):
        return self.inner.stats()

    def close(self):
        self.inner.close()
