"""Built-in tasks: lean reimplementations of well-known envs, and shmpool's own.

A recipe is a ``gymnasium.Env`` (or a natively batched env, ``batch_pong``) that does only
what its task needs, so the Python around the native simulator (the part a worker pays for
on every step) stays small.  Each recipe module has a ``tasks()`` giving
``{task id: builder}``; ``shmpool.registration`` imports the modules whose extras are
installed and registers those (the recipes never import the registry: no cycle).
"""
