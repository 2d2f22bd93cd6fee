"""Write tests/fixtures/sglang/chat-completion-0.5.23-meta-info.json: a /v1/chat/completions answer with
return_meta_info and return_spec_tokens_details, serialized by SGLang 0.5.23's OWN response models
(sglang/srt/entrypoints/openai/protocol.py), with the meta_info fields tokenizer_manager.py reports for a DFLASH
request. Run with the parser venv's Python (make sglang-env):

    .cache/sglang-parser/bin/python-0.5.23 tools/sglang_response_shapes.py
"""

import json
from pathlib import Path

from sglang.srt.entrypoints.openai.protocol import (
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatMessage,
    SglExt,
    SpecTokensDetails,
    UsageInfo,
)

OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "sglang" / "chat-completion-0.5.23-meta-info.json"
META = {"id": "0f5e", "finish_reason": {"type": "length", "length": 64}, "prompt_tokens": 12,
        "weight_version": "default", "completion_tokens": 64, "cached_tokens": 0, "spec_accept_rate": 0.3,
        "spec_accept_length": 4.923, "spec_num_correct_drafts": 51, "spec_num_proposed_drafts": 195,
        "spec_verify_ct": 13, "spec_correct_drafts_histogram": [0, 1, 2, 3, 4, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        "e2e_latency": 0.8}


def main() -> None:
    details = SpecTokensDetails(**{k: v for k, v in META.items() if k in SpecTokensDetails.model_fields})
    answer = ChatCompletionResponse(
        id="0f5e", created=1796150000, model="Qwen3.6-27B",
        choices=[ChatCompletionResponseChoice(index=0, message=ChatMessage(role="assistant", content="..."),
                                              finish_reason="length", meta_info=META)],
        usage=UsageInfo(prompt_tokens=12, completion_tokens=64, total_tokens=76),
        metadata={"weight_version": "default"}, sglext=SglExt(spec_tokens_details=details))
    OUT.write_text(json.dumps(answer.model_dump(mode="json"), indent=1) + "\n")
    print(OUT)


if __name__ == "__main__":
    main()
