"""Data sets: one module each, registered in ``mtl_cog.data.task_api.TASKS``.

Importing this package registers every task; ``TASKS`` does so on its first lookup
(``Registry(plugins="tasks")``), so no caller imports it. ``mtl_cog`` itself names no data set:
a new data set is one module here plus its name in the import below.
"""

# registration side effects:
from tasks import celeba, cifar, digits, fashion_mnist, fashion_mosaic, svhn, synthetic  # noqa: F401
