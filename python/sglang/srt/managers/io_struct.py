"""(Shared by all three processes.) Typed messages between the processes (tokenizer manager <-> scheduler <-> detokenizer).

They travel over ZMQ as msgpack, never pickled (`managers/internal_channel.py` lists the ones
that may). `GenerateReqInput` is also the request object of `/generate` and `Engine.generate`;
`normalize_batch_and_arguments` says whether it is one prompt or a batch, and
`managers/request_expansion.py` turns it into one entry per (prompt, sample) pair.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Union


def new_rid() -> str:
    return uuid.uuid4().hex


@dataclass
class GenerateReqInput:
    text: Optional[Union[List[str], str]] = None
    input_ids: Optional[Union[List[List[int]], List[int]]] = None
    input_embeds: Optional[Any] = None
    sampling_params: Optional[Union[List[Dict], Dict]] = None
    rid: Optional[Union[List[str], str]] = None
    return_logprob: Optional[Union[List[bool], bool]] = None
    logprob_start_len: Optional[Union[List[int], int]] = None
    top_logprobs_num: Optional[Union[List[int], int]] = None
    token_ids_logprob: Optional[Any] = None
    return_text_in_logprobs: bool = False
    stream: bool = False
    log_metrics: bool = True
    return_hidden_states: Union[List[bool], bool] = False
    modalities: Optional[Any] = None
    image_data: Optional[Any] = None
    video_data: Optional[Any] = None
    audio_data: Optional[Any] = None
    lora_path: Optional[Any] = None
    lora_id: Optional[Any] = None
    session_params: Optional[Any] = None
    custom_logit_processor: Optional[Any] = None
    # PD disaggregation: where the prefill server's bootstrap endpoint is, and the room id.
    bootstrap_host: Optional[Union[List[str], str]] = None
    bootstrap_port: Optional[Union[List[Optional[int]], int]] = None
    bootstrap_room: Optional[Union[List[int], int]] = None
    bootstrap_pair_key: Optional[Any] = None
    data_parallel_rank: Optional[int] = None
    routed_dp_rank: Optional[int] = None
    priority: Optional[int] = None
    extra_key: Optional[Union[List[str], str]] = None
    cache_salt: Optional[Union[List[str], str]] = None
    no_logs: bool = False
    custom_labels: Optional[Dict[str, str]] = None
    return_bytes: bool = False
    return_entropy: bool = False
    return_prompt_token_ids: bool = False
    background: bool = False
    # Filled by normalization.
    is_single: bool = True
    batch_size: int = 1

    def normalize_batch_and_arguments(self) -> None:
        if (self.text is None and self.input_ids is None and self.input_embeds is None) or (
            self.text is not None and self.input_ids is not None
        ):
            raise ValueError("Either text, input_ids or input_embeds should be provided.")
        if self.text is None and self.input_ids is None:
            raise ValueError("input_embeds is not supported by this server yet: send text or input_ids.")
        if self.text is not None:
            self.is_single = isinstance(self.text, str)
            self.batch_size = 1 if self.is_single else len(self.text)
        else:
            self.is_single = len(self.input_ids) == 0 or isinstance(self.input_ids[0], int)
            self.batch_size = 1 if self.is_single else len(self.input_ids)
        if not self.is_single and self.batch_size == 0:
            raise ValueError("The batch of prompts is empty.")


@dataclass
class EmbeddingReqInput(GenerateReqInput):
    """A request of an embedding server (`/encode`, `/v1/embeddings`, `/v1/rerank`, `/v1/score`):
    prompts in, one pooled vector per prompt out (prefill only; `sampling_params` are ignored)."""

    def normalize_batch_and_arguments(self) -> None:
        super().normalize_batch_and_arguments()
        self.sampling_params = {"max_new_tokens": 0}
        self.stream = False
        self.return_logprob = False


NOT_EMBEDDING_MODEL = ("This model does not appear to be an embedding model by default. Please add `--is-embedding` "
                       "when launching the server or try another model.")
NOT_GENERATION_MODEL = ("This server runs an embedding model (--is-embedding): it answers /v1/embeddings, /encode, "
                        "/v1/rerank and /v1/score, not text generation.")


@dataclass
class TokenizedGenerateReqInput:
    rid: str
    input_text: Optional[str]
    input_ids: List[int]
    sampling_params: Any  # SamplingParams
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    token_ids_logprob: Optional[List[int]] = None
    stream: bool = False
    bootstrap_host: Optional[str] = None
    bootstrap_port: Optional[int] = None
    bootstrap_room: Optional[int] = None
    priority: Optional[int] = None
    extra_key: Optional[str] = None
    custom_logit_processor: Optional[str] = None  # CustomLogitProcessor.to_str() (--enable-custom-logit-processor)


@dataclass
class BatchTokenIDOutput:
    """Scheduler -> detokenizer: new tokens (and finished state) of some requests."""

    rids: List[str]
    finished_reasons: List[Optional[dict]]
    output_ids: List[List[int]]  # all output ids so far, per request
    read_offsets: List[int]  # ids before this offset were already sent in an earlier chunk
    skip_special_tokens: List[bool]
    spaces_between_special_tokens: List[bool]
    no_stop_trim: List[bool]
    stop_strs: List[List[str]]
    prompt_tokens: List[int]
    completion_tokens: List[int]
    cached_tokens: List[int]
    retraction_counts: List[int]
    # Per request: list of (logprob, token_id) and top-k lists, for the new output tokens only.
    output_token_logprobs: List[Optional[list]] = field(default_factory=list)
    output_top_logprobs: List[Optional[list]] = field(default_factory=list)
    input_token_logprobs: List[Optional[list]] = field(default_factory=list)
    input_top_logprobs: List[Optional[list]] = field(default_factory=list)
    # With token_ids_logprob: per position, [(logprob, token_id)] of the requested ids.
    output_token_ids_logprobs: List[Optional[list]] = field(default_factory=list)
    input_token_ids_logprobs: List[Optional[list]] = field(default_factory=list)
    # Embedding servers: the pooled vector of each finished request (None otherwise).
    embeddings: List[Optional[list]] = field(default_factory=list)


@dataclass
class BatchStrOutput:
    """Detokenizer -> tokenizer manager: BatchTokenIDOutput plus the decoded text so far."""

    rids: List[str]
    finished_reasons: List[Optional[dict]]
    output_strs: List[str]  # full text so far per request (stop strings trimmed at the end)
    output_ids: List[List[int]]
    prompt_tokens: List[int]
    completion_tokens: List[int]
    cached_tokens: List[int]
    retraction_counts: List[int]
    output_token_logprobs: List[Optional[list]] = field(default_factory=list)
    output_top_logprobs: List[Optional[list]] = field(default_factory=list)
    input_token_logprobs: List[Optional[list]] = field(default_factory=list)
    input_top_logprobs: List[Optional[list]] = field(default_factory=list)
    # With token_ids_logprob: per position, [(logprob, token_id)] of the requested ids.
    output_token_ids_logprobs: List[Optional[list]] = field(default_factory=list)
    input_token_ids_logprobs: List[Optional[list]] = field(default_factory=list)
    # Embedding servers: the pooled vector of each finished request (None otherwise).
    embeddings: List[Optional[list]] = field(default_factory=list)


@dataclass
class AbortReq:
    rid: str = ""
    abort_all: bool = False
    finished_reason: Optional[dict] = None


@dataclass
class RejectedRequest:
    """Tokenizer -> scheduler on a PD server: a request was refused before it was sent, and its
    PD peer (which got the same request from the router) must be told not to wait for it."""

    bootstrap_host: Optional[str]
    bootstrap_port: Optional[int]
    bootstrap_rooms: List[int]
    message: str
    status_code: int = 400


@dataclass
class FlushCacheReqInput:
    pass


@dataclass
class FlushCacheReqOutput:
    success: bool
    dp_rank: int = 0  # the replica that answers (--dp-size): the tokenizer waits for one per replica


@dataclass
class GetInternalStateReq:
    pass


@dataclass
class GetInternalStateReqOutput:
    internal_state: Dict[str, Any]
    dp_rank: int = 0  # the replica that answers (--dp-size)


@dataclass
class SchedulerReady:
    """Sent once by the scheduler after its model and pools are built."""

    info: Dict[str, Any]
