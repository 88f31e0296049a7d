"""A supervised model's life, knowing no backend: its states and status, starting, the child's run and watchers, the slots requests take, the context steps."""
