"""Data: the task contract, the decode-once uint8 cache, batches and on-device augmentation."""
