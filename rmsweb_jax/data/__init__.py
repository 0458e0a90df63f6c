"""Grain data pipelines from the trajectory store to the trainer's batch contract.

- sft.py: SFT examples (reflection-free successful steps) -> prompts -> tokens, loss mask, image
  patches -> batches; held-out split by task group; per-host sharding; resumable `SFTBatches`
- batching.py: fixed-shape batches by length bucketing or packing with segment ids (Grain IterDatasets)
"""
