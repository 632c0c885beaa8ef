"""Synchronous averaging: DDP (all-reduce SGD), local SGD, post-local SGD, SlowMo, DiLoCo, Streaming DiLoCo (eager
updates), SparseLoCo."""
