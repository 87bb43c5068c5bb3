"""Separating a reasoning model's `<think>...</think>` section from its answer, as upstream's
`sglang.srt.parser.reasoning_parser` (`ReasoningParser` with its `DetectorMap`).

  * "deepseek-r1" and "qwen3-thinking": the output starts inside the reasoning section (the chat
    template already opened it), which ends at `</think>`; a leading `<think>` is stripped.
    Without a `</think>` the whole output is reasoning (it was cut short).
  * "qwen3": reasoning only when the output starts with `<think>` (thinking enabled); otherwise
    it is all normal text. `force_reasoning=True` makes it behave like "deepseek-r1".

One-shot (`parse_non_stream`): the reasoning text without the tags, `.strip()`-ed, and the text
after `</think>` with its leading whitespace stripped (unchanged when there is no reasoning).
Streamed (`parse_stream_chunk`): reasoning streams out as it comes, holding back only what may be
the start of `</think>` (or, at the very start, of `<think>`); the text after the end tag streams
as normal text. With `stream_reasoning=False` the reasoning comes out in one piece at `</think>`.
`finish` gives out what was held back when the stream ends (upstream's later `finish`). The
streamed pieces concatenate to the one-shot result up to that whitespace stripping.

The other families, under upstream's names: "deepseek-v3" (`<think>` tags; the output starts inside
the reasoning when the request's `chat_template_kwargs` ask for `thinking`, as DeepSeek-V3.1's
template then opens it), "glm45" and "interns1" (as "qwen3"), "kimi" (`◁think▷` ... `◁/think▷`),
"kimi_k2" (`<think>` tags; a `<|tool_calls_section_begin|>` also ends the reasoning and stays in
the text for the tool-call parser), "minimax" (always reasoning, `<think>` tags),
"minimax-append-think" (no split: the text is given back with the `<think>` its template swallowed),
"mistral" (`[THINK]` ... `[/THINK]`), "step3" / "step3p5" (as "deepseek-r1") and "gpt-oss" (harmony:
the `analysis` channel is the reasoning, ended by `<|end|>`; the final channel's markers are not text).
"""

from typing import Dict, Optional, Tuple, Type

START, REASONING, NORMAL = "start", "reasoning", "normal"


def _partial_suffix_len(text: str, token: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `token` (0 if none)."""
    for n in range(min(len(text), len(token) - 1), 0, -1):
        if token.startswith(text[-n:]):
            return n
    return 0


class StreamingParseResult:
    """The normal text and the reasoning text of one parse step."""

    def __init__(self, normal_text: Optional[str] = None, reasoning_text: Optional[str] = None):
        self.normal_text = normal_text or ""
        self.reasoning_text = reasoning_text or ""


class BaseReasoningFormatDetector:
    """A `<start>reasoning<end>answer` format, parsed in one go or streamed."""

    tool_start_token: Optional[str] = None  # also ends the reasoning (and stays in the normal text)

    def __init__(self, think_start_token: str, think_end_token: str, force_reasoning: bool = False,
                 stream_reasoning: bool = True):
        self.think_start_token = think_start_token
        self.think_end_token = think_end_token
        self.force_reasoning = force_reasoning
        self.stream_reasoning = stream_reasoning
        self._state = START
        self._buffer = ""
        self._held_reasoning = ""  # reasoning kept back while stream_reasoning is False
        self.had_reasoning = False  # a reasoning section was entered

    def detect_and_parse(self, text: str) -> StreamingParseResult:
        """A whole output -> its reasoning (tags removed, stripped) and its normal text."""
        scanner = type(self)(force_reasoning=self.force_reasoning, stream_reasoning=True)
        first, last = scanner.parse_streaming_increment(text), scanner.finish()
        if not scanner.had_reasoning:
            return StreamingParseResult(normal_text=text)
        return StreamingParseResult(
            normal_text=(first.normal_text + last.normal_text).lstrip(),
            reasoning_text=(first.reasoning_text + last.reasoning_text).strip(),
        )

    def parse_streaming_increment(self, new_text: str) -> StreamingParseResult:
        """The next chunk of a stream -> the reasoning and normal text it makes certain."""
        self._buffer += new_text
        return self._consume(final=False)

    def finish(self) -> StreamingParseResult:
        """The stream ended: give out what was held back."""
        return self._consume(final=True)

    def _consume(self, final: bool) -> StreamingParseResult:
        reasoning, normal = "", ""
        if self._state == START:
            lead = self._buffer.lstrip()
            if lead.startswith(self.think_start_token):
                self._buffer = lead[len(self.think_start_token):]
                self._state = REASONING
            elif self.think_start_token.startswith(lead) and not final:
                return StreamingParseResult()  # may still become <think>
            else:
                self._state = REASONING if self.force_reasoning else NORMAL
            self.had_reasoning = self._state == REASONING
        if self._state == REASONING:
            end, after = self._reasoning_end()
            if end >= 0:
                reasoning = self._held_reasoning + self._buffer[:end]
                self._buffer = self._buffer[after:]
                self._held_reasoning = ""
                self._state = NORMAL
            else:
                ends = [self.think_end_token] + ([self.tool_start_token] if self.tool_start_token else [])
                keep = 0 if final else max(_partial_suffix_len(self._buffer, t) for t in ends)
                self._held_reasoning += self._buffer[: len(self._buffer) - keep]
                self._buffer = self._buffer[len(self._buffer) - keep:]
                if self.stream_reasoning or final:
                    reasoning, self._held_reasoning = self._held_reasoning, ""
        if self._state == NORMAL:
            normal, self._buffer = self._buffer, ""
        return StreamingParseResult(normal_text=normal, reasoning_text=reasoning)

    def _reasoning_end(self) -> Tuple[int, int]:
        """(where the reasoning in the buffer ends, where the normal text starts); (-1, -1) if not yet."""
        end = self._buffer.find(self.think_end_token)
        tool = self._buffer.find(self.tool_start_token) if self.tool_start_token else -1
        if tool >= 0 and (end < 0 or tool < end):
            return tool, tool
        return (end, end + len(self.think_end_token)) if end >= 0 else (-1, -1)


class DeepSeekR1Detector(BaseReasoningFormatDetector):
    """DeepSeek-R1: always reasoning until `</think>` (R1-0528 also emits the `<think>`)."""

    def __init__(self, stream_reasoning: bool = True, force_reasoning: bool = True):
        super().__init__("<think>", "</think>", force_reasoning=True, stream_reasoning=stream_reasoning)


class Qwen3Detector(BaseReasoningFormatDetector):
    """Qwen3: reasoning when the output opens with `<think>` (enable_thinking), else none."""

    def __init__(self, stream_reasoning: bool = True, force_reasoning: bool = False):
        super().__init__("<think>", "</think>", force_reasoning=force_reasoning,
                         stream_reasoning=stream_reasoning)


class KimiDetector(BaseReasoningFormatDetector):
    def __init__(self, stream_reasoning: bool = True, force_reasoning: bool = False):
        super().__init__("◁think▷", "◁/think▷", force_reasoning=False, stream_reasoning=stream_reasoning)


class KimiK2Detector(Qwen3Detector):
    tool_start_token = "<|tool_calls_section_begin|>"


class MistralDetector(BaseReasoningFormatDetector):
    def __init__(self, stream_reasoning: bool = True, force_reasoning: bool = False):
        super().__init__("[THINK]", "[/THINK]", force_reasoning=force_reasoning, stream_reasoning=stream_reasoning)


class MiniMaxAppendThinkDetector(BaseReasoningFormatDetector):
    """MiniMax-M2 with reasoning left in the text: the template opened `<think>`, so the text is
    given back with it."""

    def __init__(self, stream_reasoning: bool = True, force_reasoning: bool = False):
        super().__init__("<think>", "</think>", stream_reasoning=stream_reasoning)
        self._started = False

    def _consume(self, final: bool) -> StreamingParseResult:
        text, self._buffer = self._buffer, ""
        if text and not self._started:
            self._started = True
            text = self.think_start_token + text
        return StreamingParseResult(normal_text=text)

    def detect_and_parse(self, text: str) -> StreamingParseResult:
        return StreamingParseResult(normal_text=self.think_start_token + text)


_HARMONY_FINAL_MARKERS = ("<|start|>assistant<|channel|>final<|message|>", "<|channel|>final<|message|>",
                          "<|return|>")


class GptOssDetector(BaseReasoningFormatDetector):
    """Harmony: `<|channel|>analysis<|message|>...<|end|>` is the reasoning; the final channel's
    markers are removed from the normal text (held back while one may be starting)."""

    def __init__(self, stream_reasoning: bool = True, force_reasoning: bool = False):
        super().__init__("<|channel|>analysis<|message|>", "<|end|>", stream_reasoning=stream_reasoning)
        self._normal_held = ""

    def _consume(self, final: bool) -> StreamingParseResult:
        if self._state == START and self._buffer.lstrip().startswith("<|start|>assistant"):
            self._buffer = self._buffer.lstrip()[len("<|start|>assistant"):]
        elif self._state == START and "<|start|>assistant".startswith(self._buffer.lstrip()) and not final:
            return StreamingParseResult()
        ret = super()._consume(final)
        text = self._normal_held + ret.normal_text
        for marker in _HARMONY_FINAL_MARKERS:
            text = text.replace(marker, "")
        keep = 0 if final else max(_partial_suffix_len(text, m) for m in _HARMONY_FINAL_MARKERS)
        self._normal_held = text[len(text) - keep:]
        ret.normal_text = text[: len(text) - keep]
        return ret

    def detect_and_parse(self, text: str) -> StreamingParseResult:
        scanner = GptOssDetector()
        first, last = scanner.parse_streaming_increment(text), scanner.finish()
        normal = first.normal_text + last.normal_text
        if not scanner.had_reasoning:
            return StreamingParseResult(normal_text=normal)
        return StreamingParseResult(normal_text=normal.lstrip(),
                                    reasoning_text=(first.reasoning_text + last.reasoning_text).strip())


class ReasoningParser:
    """Picks the reasoning detector by the `--reasoning-parser` name (upstream's names)."""

    DetectorMap: Dict[str, Type[BaseReasoningFormatDetector]] = {
        "deepseek-r1": DeepSeekR1Detector,
        "deepseek-v3": Qwen3Detector,  # forced when the request asks for thinking (below)
        "glm45": Qwen3Detector,
        "gpt-oss": GptOssDetector,
        "interns1": Qwen3Detector,
        "kimi": KimiDetector,
        "kimi_k2": KimiK2Detector,
        "minimax": Qwen3Detector,  # always thinking: forced below
        "minimax-append-think": MiniMaxAppendThinkDetector,
        "mistral": MistralDetector,
        "qwen3": Qwen3Detector,
        "qwen3-thinking": Qwen3Detector,  # always thinking: forced below
        "step3": DeepSeekR1Detector,
        "step3p5": DeepSeekR1Detector,
    }
    FORCED = {"qwen3-thinking", "minimax"}

    def __init__(self, model_type: str, stream_reasoning: bool = True, force_reasoning: Optional[bool] = None,
                 request=None):
        key = (model_type or "").lower()
        detector_class = self.DetectorMap.get(key)
        if detector_class is None:
            raise ValueError(f"Unsupported model type: {model_type}")
        if key in self.FORCED:
            force_reasoning = True
        if key == "deepseek-v3" and force_reasoning is None:
            # DeepSeek-V3.1's template ends with `<think>` when asked to think: the output starts inside it
            kwargs = getattr(request, "chat_template_kwargs", None) or {}
            force_reasoning = bool(kwargs.get("thinking") or kwargs.get("enable_thinking"))
        kwargs = {"stream_reasoning": stream_reasoning}
        if force_reasoning is not None:
            kwargs["force_reasoning"] = force_reasoning
        self.detector = detector_class(**kwargs)

    def parse_non_stream(self, full_text: str) -> Tuple[Optional[str], Optional[str]]:
        """A whole output -> (reasoning_text, normal_text); "" for a part that is absent."""
        ret = self.detector.detect_and_parse(full_text)
        return ret.reasoning_text, ret.normal_text

    def parse_stream_chunk(self, chunk_text: str) -> Tuple[str, str]:
        """The next chunk of a stream -> (reasoning_text, normal_text) to send now."""
        ret = self.detector.parse_streaming_increment(chunk_text)
        return ret.reasoning_text, ret.normal_text

    def finish(self) -> Tuple[str, str]:
        """The stream ended -> (reasoning_text, normal_text) that was still held back."""
        ret = self.detector.finish()
        return ret.reasoning_text, ret.normal_text
