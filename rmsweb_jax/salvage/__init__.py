"""Salvage-DS: group-relative RL on the SFT policy's critical states.

rewards.py (scores of sampled turns), gates.py (contrast / competence routing of groups),
dynamic_sampling.py (draw states until B groups pass the gates), batches.py (policy and anchor rows),
state_prompts.py (the state set's prompts, encoded once), learner.py (one update's parts as a learner
object: SalvageDSLearner, and GRPOLearner, plain GRPO, as a subclass).
"""
