"""Failure-mode mining: the SFT policy's critical states in the trajectory corpus.

- state_set.py: CriticalState, the RL state set file (write_state_set, StateSet).
- taxonomy.py: TAXONOMY and the maps from compare_actions categories, parse errors and episode ends.
- replay.py: K samples per reference step, scored against the stored action; reference log-probs.
- rollouts.py: on-policy rollouts and their divergence from the reference trajectories.
- report.py: the report (JSON, markdown, PNG bars by failure mode, table by task).
"""
