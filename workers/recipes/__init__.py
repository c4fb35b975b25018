"""Built-in env recipes: lean reimplementations of well-known tasks.

A recipe is a ``gymnasium.Env`` that does only what its task needs, so the
Python around the native simulator (the part a worker pays for on every step)
stays small.  Each recipe module has a ``register()`` that adds its task ids to
:func:`shmpool.registration.register_task`; nothing registers at import time.
"""
