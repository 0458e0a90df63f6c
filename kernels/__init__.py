"""Pallas kernels, each beside the pure-JAX reference it is tested against.

grouped_advantage   grouped (GRPO) advantages + Salvage-DS contrast/competence gates
token_logprobs      log p(target token) from hidden states and the LM head, no [T, V] logits
                    (paths: token_logprobs_chunked (CPU), token_logprobs_tpu, token_logprobs_gpu)

Each public function takes impl=None (Pallas on TPU, pure JAX on CPU and GPU), "reference",
"pallas" or "pallas_interpret" (see kernels._dispatch).
"""
