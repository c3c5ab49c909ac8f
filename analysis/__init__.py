"""
What eval.py measures besides a checkpoint's loss, one module per analysis: the depth map (depth_map.py), the loss
curves of runs (curves.py), the log-likelihood of continuations for multiple choice and lm-evaluation-harness
(scoring.py), and which earlier representations each block reads (wiring.py); figures.py draws to files.
"""
