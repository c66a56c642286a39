"""Data sets: one module each, registered in ``mtl_cog.data.task_api.TASKS``.

Importing this package registers every task. ``mtl_cog`` itself names no data set.
"""

from tasks import celeba, cifar, digits, fashion_mnist, fashion_mosaic, svhn, synthetic  # noqa: F401  (registration side effects)
