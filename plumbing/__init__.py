"""Plumbing a learner may skip: options and their checks, one-line errors, the checks before a run, and the readers
that check every file a script reads."""
