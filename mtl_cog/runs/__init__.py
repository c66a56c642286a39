"""Run folders: file names and checks, checkpoints, resumable state, tracking, finished runs."""
