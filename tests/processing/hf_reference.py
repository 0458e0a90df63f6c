"""transformers' Qwen3-VL processing classes, configured as the published Qwen3-VL checkpoints use them."""
from transformers import Qwen2VLImageProcessorPil
from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor


def hf_image_processor(min_pixels: int = 65536, max_pixels: int = 16777216) -> Qwen2VLImageProcessorPil:
    """Returns transformers' image processor configured as Qwen3-VL's published preprocessor_config.json."""
    return Qwen2VLImageProcessorPil(
        patch_size=16,
        merge_size=2,
        temporal_patch_size=2,
        image_mean=[0.5] * 3,
        image_std=[0.5] * 3,
        size={"shortest_edge": min_pixels, "longest_edge": max_pixels},
    )


class ImageOnlyQwen3VLProcessor(Qwen3VLProcessor):
    """transformers' Qwen3VLProcessor minus its video processor (needs torchvision).

    Only the sub-processor bookkeeping is overridden; placeholder expansion, token counting and
    mm_token_type_ids are transformers' own code.
    """

    @classmethod
    def get_attributes(cls):
        return ["image_processor", "tokenizer"]

    def check_argument_for_proper_class(self, attribute_name, arg):
        return None
