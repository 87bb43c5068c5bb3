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
            end = self._buffer.find(self.think_end_token)
            if end >= 0:
                reasoning = self._held_reasoning + self._buffer[:end]
                self._buffer = self._buffer[end + len(self.think_end_token):]
                self._held_reasoning = ""
                self._state = NORMAL
            else:
                keep = 0 if final else _partial_suffix_len(self._buffer, self.think_end_token)
                self._held_reasoning += self._buffer[: len(self._buffer) - keep]
                self._buffer = self._buffer[len(self._buffer) - keep:]
                if self.stream_reasoning or final:
                    reasoning, self._held_reasoning = self._held_reasoning, ""
        if self._state == NORMAL:
            normal, self._buffer = self._buffer, ""
        return StreamingParseResult(normal_text=normal, reasoning_text=reasoning)


class DeepSeekR1Detector(BaseReasoningFormatDetector):
    """DeepSeek-R1: always reasoning until `</think>` (R1-0528 also emits the `<think>`)."""

    def __init__(self, stream_reasoning: bool = True, force_reasoning: bool = True):
        super().__init__("<think>", "</think>", force_reasoning=True, stream_reasoning=stream_reasoning)


class Qwen3Detector(BaseReasoningFormatDetector):
    """Qwen3: reasoning when the output opens with `<think>` (enable_thinking), else none."""

    def __init__(self, stream_reasoning: bool = True, force_reasoning: bool = False):
        super().__init__("<think>", "</think>", force_reasoning=force_reasoning,
                         stream_reasoning=stream_reasoning)


class ReasoningParser:
    """Picks the reasoning detector by the `--reasoning-parser` name."""

    DetectorMap: Dict[str, Type[BaseReasoningFormatDetector]] = {
        "deepseek-r1": DeepSeekR1Detector,
        "qwen3": Qwen3Detector,
        "qwen3-thinking": Qwen3Detector,  # always thinking: forced below
    }
    FORCED = {"qwen3-thinking"}

    def __init__(self, model_type: str, stream_reasoning: bool = True, force_reasoning: Optional[bool] = None):
        key = (model_type or "").lower()
        detector_class = self.DetectorMap.get(key)
        if detector_class is None:
            raise ValueError(f"Unsupported model type: {model_type}")
        if key in self.FORCED:
            force_reasoning = True
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
