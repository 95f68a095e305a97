"""Context-window accounting and compaction: long sessions keep running under the window.

**Estimate.** Before a model call the prompt is estimated: the prompt tokens the model
reported for the run's last call, plus a count of what was added since (the reply and the
steps after it); without such a report (a new run, a history read from the store), a count
of the whole context. Counts are tiktoken's for OpenAI's model families when the encoding is
at hand, else a character estimate (engine/tokens.py), plus 4 tokens a message and the
tools' JSON.

**Plan.** Above `trigger_ratio` of the window, the oldest steps of the context are
summarized. The window is the configured one, or the smaller one the provider stated when
it refused a request as too long (engine/context_window.py: learned for the process's
life). The context is the latest summary step (if any) followed by the steps after the
range it covers; the cut falls where a user step or an assistant step begins (a tool result
stays with its call), leaves at least `keep_recent_steps` steps after it (on an overflow,
only the latest turn), and never inside the turn in progress.

**Summary.** One model call (traced as its own `chat` span) summarizes the earlier summary
and the covered steps, rendered as a transcript (`render_transcript`) of at most half the
summary model's window: a longer backlog is summarized a part at a time, each summary taking
in the one before. A summary request the provider refuses as too long is made again on a
smaller part (half the refused one, or half the window the refusal states), until not even
one turn fits. The summary is a step of role SUMMARY stored at the end of the log with the
range it covers (`summary_first_sequence`..`summary_last_sequence`); the covered steps stay
in the log, so ListSteps shows everything, and a fork or retry before the summary step
rebuilds the context from the originals (engine/context.py reads the latest summary only).

**Before and after.** Both estimates of a compaction are measured alike: the estimate after
is the count of the compacted context scaled by the ratio of the estimate before to the count
of the context before, so when the model's report anchored the estimate before, the one
after is in the provider's tokens too, and the next part of a backlog is decided on it.

Pure planning and the summary calls; never touches the store or the event channel (the loop
and the session service do), never imports grpc.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Final, Literal

from agio_grpc.domain import SUMMARY_PREFIX, Role, Run, Step, StepMetrics, StopReason, StopSignal
from agio_grpc.engine.agents import Compaction, RunSettings
from agio_grpc.engine.context import after_summary, context_steps, latest_summary
from agio_grpc.engine.context_window import LEARNED_WINDOWS, context_refusal
from agio_grpc.engine.events import ContextCompacted, Event, StepCompleted
from agio_grpc.engine.models import ModelDriver, ModelError, ModelEvent, ModelReply, ModelRequest
from agio_grpc.engine.tokens import Counter, counter_for, estimate_text_tokens
from agio_grpc.engine.tools import ToolRegistry
from agio_grpc.engine.tracing import RunTrace

Trigger = Literal["threshold", "overflow", "request"]
"""What set a compaction off: the estimate passed the trigger ratio, the provider refused
the context as too long, or CompactSession."""

MESSAGE_OVERHEAD_TOKENS: Final = 4
"""Tokens a message costs besides its text (role, separators), as OpenAI counts them."""
STEP_TRANSCRIPT_CHARS: Final = 8_000
"""The most characters of one step a summary request quotes (the rest is marked as cut)."""
SUMMARY_MAX_TOKENS: Final = 2_048
"""The completion cap of a summary call."""
MAX_COMPACTIONS_PER_CALL: Final = 64
"""The most summaries made before one model call (a backlog larger than half the window is
summarized a part at a time)."""

DEFAULT_SUMMARY_INSTRUCTIONS: Final = (
    "You compact the conversation of an AI agent so that it can go on working from your "
    "summary instead of the messages. Write a concise summary of the conversation you are "
    "given: the user's goals and requests, facts and decisions established, tool results "
    "that still matter (with their key values), and the work still open. Write it as notes "
    "for the agent, in the conversation's language. Do not add anything new."
)

DEFAULT_CONTEXT_WINDOW: Final = 128_000
"""The window of a model this table does not know."""

# Known model families by name prefix (the longest matching prefix wins).
_WINDOWS: Final[dict[str, int]] = {
    "gpt-3.5-turbo": 16_385,
    "gpt-4": 8_192,
    "gpt-4-32k": 32_768,
    "gpt-4-turbo": 128_000,
    "gpt-4o": 128_000,
    "gpt-4.1": 1_047_576,
    "gpt-5": 400_000,
    "o1": 200_000,
    "o3": 200_000,
    "o4": 200_000,
    "claude": 200_000,
    "gemini-1.5": 1_048_576,
    "gemini-2": 1_048_576,
    "llama-3": 131_072,
    "llama3": 131_072,
    "mistral-large": 131_072,
    "qwen2.5": 131_072,
    "deepseek": 128_000,
}


def default_context_window(model: str) -> int:
    """The context window of `model`'s family (by name prefix, provider prefix such as
    `openai/` ignored), else DEFAULT_CONTEXT_WINDOW."""
    name = model.rpartition("/")[2].lower()
    matches = [prefix for prefix in _WINDOWS if name.startswith(prefix)]
    return _WINDOWS[max(matches, key=len)] if matches else DEFAULT_CONTEXT_WINDOW


def context_window(settings: RunSettings) -> int:
    """The window the run's model is compacted to: the configured one, or the smaller one
    its provider stated in a refusal."""
    return LEARNED_WINDOWS.window(settings.model, settings.compaction.context_window_tokens)


def summary_window(settings: RunSettings) -> int:
    """The window a summary request must fit: the run's, or the smaller one the summary
    model's provider stated in a refusal."""
    model = settings.compaction.model or settings.model
    return LEARNED_WINDOWS.window(model, context_window(settings))


class TokenCount:
    """Counts the prompt tokens of steps, texts and tool definitions with one counter
    (engine/tokens.py); with a tokenizer, a stored step's count is kept by its id (a stored
    step never changes), so a long session is tokenized once per process."""

    def __init__(self, name: str, count: Counter, kept_steps: int = 0) -> None:
        self.name = name
        self.text = count
        self._prefix = count(SUMMARY_PREFIX)
        self._kept: OrderedDict[str, int] = OrderedDict()
        self._most_kept = kept_steps

    def step(self, step: Step) -> int:
        """A step's message: its text, its tool calls, the message overhead."""
        kept = self._kept.get(step.id) if self._most_kept and step.id else None
        if kept is not None:
            return kept
        count = self.text
        tokens = MESSAGE_OVERHEAD_TOKENS + count(step.content)
        if step.role is Role.SUMMARY:  # sent after a prefix (Step.to_message)
            tokens += self._prefix
        for call in step.tool_calls:
            tokens += MESSAGE_OVERHEAD_TOKENS + count(call.name + call.arguments)
        if self._most_kept and step.id and step.sequence:
            self._kept[step.id] = tokens
            if len(self._kept) > self._most_kept:
                self._kept.popitem(last=False)
        return tokens

    def steps(self, steps: Sequence[Step]) -> int:
        return sum(map(self.step, steps))

    def tools(self, tools: Sequence[dict[str, Any]]) -> int:
        return self.text(json.dumps(tools)) if tools else 0

    def prompt(self, context: Sequence[Step], tools: Sequence[dict[str, Any]]) -> int:
        """The prompt tokens of a model call on `context` (engine/context.py
        `context_steps`) offering `tools`: the prompt tokens reported for the last assistant
        step's call plus the count of that reply and what follows it, when there is such a
        report; else the count of everything. A report from before the context's summary
        was made counts the steps it replaced, so it is not used."""
        summary = next((step for step in context if step.role is Role.SUMMARY), None)
        reported = self._since_report(context, summary)
        return reported if reported is not None else self.counted(context, tools)

    def counted(self, context: Sequence[Step], tools: Sequence[dict[str, Any]]) -> int:
        """`prompt` counted in full, whatever the model reported."""
        return self.tools(tools) + self.steps(context)

    def history(
        self, instructions: str, history: Sequence[Step], tools: Sequence[dict[str, Any]]
    ) -> int:
        """`prompt` of the context `history` makes (without `max_history_messages`), read
        off the history without building it: the reported path looks only at the steps
        since the run's last model call."""
        summary = latest_summary(history)
        steps = history if summary is None else after_summary(history, summary)
        reported = self._since_report(steps, summary)
        if reported is not None:
            return reported
        tokens = self.tools(tools) + MESSAGE_OVERHEAD_TOKENS + self.text(instructions)
        if summary is not None:
            tokens += self.step(summary)
        return tokens + self.steps(steps)

    def _since_report(self, steps: Sequence[Step], summary: Step | None) -> int | None:
        """The prompt tokens the model reported for the last call among `steps` (one made
        after `summary` was, if any) plus the count of its reply and what follows; None
        without such a report."""
        reported_after = summary.sequence if summary is not None else 0
        for index in range(len(steps) - 1, -1, -1):
            step = steps[index]
            if step.sequence <= reported_after:
                return None
            if step.role is Role.ASSISTANT and step.metrics.input_tokens > 0:
                return step.metrics.input_tokens + self.steps(steps[index:])
        return None


ESTIMATE: Final = TokenCount("estimate", estimate_text_tokens)
"""The character estimate (engine/tokens.py), for models of no known tokenizer."""
KEPT_STEP_COUNTS: Final = 200_000
"""How many steps' token counts a tokenizer's `TokenCount` keeps (about 20 MB)."""
_token_counts: dict[str, TokenCount] = {"estimate": ESTIMATE}


def token_count_for(model: str) -> TokenCount:
    """The `TokenCount` of `model`: tiktoken's for OpenAI's families when its encoding is
    cached, else the character estimate (engine/tokens.py)."""
    name, count = counter_for(model)
    known = _token_counts.get(name)
    if known is None:
        known = _token_counts[name] = TokenCount(name, count, KEPT_STEP_COUNTS)
    return known


@dataclass(frozen=True, slots=True)
class CompactionPlan:
    """What a compaction summarizes: the earlier summary (if any) and the covered steps."""

    previous: Step | None
    covered: list[Step]
    first_sequence: int
    last_sequence: int
    partial: bool = False
    """The budget of one summary request cut it short: more is left to summarize."""
    tokens: int = 0
    """The estimated tokens of its transcript (`render_transcript`)."""


def plan_compaction(
    history: Sequence[Step], keep_recent_steps: int, budget_tokens: int | None = None
) -> CompactionPlan | None:
    """The oldest steps of the context to summarize, keeping at least `keep_recent_steps`
    after the cut and always the latest turn; None when no cut is possible. With
    `budget_tokens`, no more than fit one summary request of that size (at least one turn):
    a longer backlog is summarized a part at a time, each summary taking in the one before."""
    previous = latest_summary(history)
    steps = after_summary(history, previous)
    wanted = at_most = len(steps) - max(0, keep_recent_steps)
    quoted = estimate_text_tokens(_cut(previous.content)) if previous is not None else 0
    if budget_tokens is not None:
        used = quoted
        for index, step in enumerate(steps):
            used += _transcript_tokens(step)
            if used > budget_tokens:
                at_most = min(at_most, max(index, 1))
                break
    cut = _last_cut(steps, at_most)
    if cut <= 0 and budget_tokens is not None and at_most >= 1:
        cut = _first_cut(steps, wanted)
    if cut <= 0:
        return None
    covered = steps[:cut]
    first = previous.summary_first_sequence if previous is not None else covered[0].sequence
    partial = _last_cut(steps, wanted) > cut
    tokens = quoted + sum(map(_transcript_tokens, covered))
    return CompactionPlan(previous, covered, first, covered[-1].sequence, partial, tokens)


def _last_cut(steps: Sequence[Step], at_most: int) -> int:
    """The last index <= `at_most` (and before the last step) where a turn begins (a user
    or assistant step) with every tool call before it answered before it; 0 when none."""
    best = 0
    open_calls: set[str] = set()
    for index, step in enumerate(steps):
        if index > at_most or index == len(steps) - 1:
            break
        if index > 0 and step.role in (Role.USER, Role.ASSISTANT) and not open_calls:
            best = index
        if step.role is Role.ASSISTANT:
            open_calls = {call.id for call in step.tool_calls}
        elif step.role is Role.TOOL:
            open_calls.discard(step.tool_call_id)
    return best


def _first_cut(steps: Sequence[Step], at_most: int) -> int:
    """The first index a cut may fall at (as `_last_cut`), if <= `at_most`; else 0."""
    open_calls: set[str] = set()
    for index, step in enumerate(steps[: len(steps) - 1]):
        if index > at_most:
            break
        if index > 0 and step.role in (Role.USER, Role.ASSISTANT) and not open_calls:
            return index
        if step.role is Role.ASSISTANT:
            open_calls = {call.id for call in step.tool_calls}
        elif step.role is Role.TOOL:
            open_calls.discard(step.tool_call_id)
    return 0


def _transcript_tokens(step: Step) -> int:
    """A step's share of a summary request (its texts cut as `render_transcript` cuts)."""
    tokens = MESSAGE_OVERHEAD_TOKENS + estimate_text_tokens(_cut(step.content))
    for call in step.tool_calls:
        tokens += MESSAGE_OVERHEAD_TOKENS + estimate_text_tokens(call.name + _cut(call.arguments))
    return tokens


def render_transcript(plan: CompactionPlan) -> str:
    """The summary request's user message: the earlier summary, then the covered steps."""
    parts: list[str] = []
    if plan.previous is not None:
        parts.append(f"Summary of the conversation before:\n{_cut(plan.previous.content)}\n")
    parts.append("Conversation to summarize:")
    for step in plan.covered:
        match step.role:
            case Role.ASSISTANT:
                if step.content:
                    parts.append(f"[assistant] {_cut(step.content)}")
                for call in step.tool_calls:
                    parts.append(f"[assistant calls {call.name}] {_cut(call.arguments)}")
            case Role.TOOL:
                failed = " (error)" if step.is_error else ""
                parts.append(f"[result of {step.name or 'tool'}{failed}] {_cut(step.content)}")
            case _:
                parts.append(f"[{step.role.value}] {_cut(step.content)}")
    return "\n".join(parts)


def _cut(text: str) -> str:
    if len(text) <= STEP_TRANSCRIPT_CHARS:
        return text
    cut = len(text) - STEP_TRANSCRIPT_CHARS
    return f"{text[:STEP_TRANSCRIPT_CHARS]} [... {cut} more characters cut]"


def summary_request(
    plan: CompactionPlan, policy: Compaction, model: str, window: int
) -> ModelRequest:
    """The model request that summarizes `plan` (no tools), for a model of `window` tokens:
    the summary may take a quarter of it, up to SUMMARY_MAX_TOKENS (a provider counts the
    completion's cap in the window)."""
    return ModelRequest(
        model=policy.model or model,
        messages=[
            {"role": "system", "content": policy.instructions or DEFAULT_SUMMARY_INSTRUCTIONS},
            {"role": "user", "content": render_transcript(plan)},
        ],
        tools=[],
        temperature=None,
        max_tokens=max(1, min(SUMMARY_MAX_TOKENS, window // 4)),
    )


def context_window_signal(error: ModelError) -> StopSignal:
    """The stop of a run whose context the model refuses as too long even compacted (or
    with compaction off), with the refusal's HTTP status and error code when it had them."""
    context: dict[str, object] = {}
    if error.status_code is not None:
        context["status_code"] = error.status_code
    if error.error_code is not None:
        context["error_code"] = error.error_code
    return StopSignal(
        StopReason.CONTEXT_WINDOW,
        f"the context does not fit the model's context window: {error.message}",
        "model",
        context=context,
    )


@dataclass(frozen=True, slots=True)
class Summary:
    """A summary step ready to store, with the estimates around it."""

    step: Step
    tokens_before: int
    tokens_after: int
    """Measured as `tokens_before` was (see the module docstring)."""
    trigger: Trigger
    budget_tokens: int
    """The most transcript tokens its summary request held (smaller after a refusal)."""

    def announce(self, _: Run | None, steps: Sequence[Step]) -> list[Event]:
        """The events of its write (a `channel.Announce`): its `step_completed`, then
        `context_compacted`."""
        (stored,) = steps
        return [
            StepCompleted(stored),
            ContextCompacted(
                step_id=stored.id,
                sequence=stored.sequence,
                first_sequence=stored.summary_first_sequence,
                last_sequence=stored.summary_last_sequence,
                tokens_before=self.tokens_before,
                tokens_after=self.tokens_after,
                trigger=self.trigger,
            ),
        ]


@dataclass(frozen=True, slots=True)
class Compacting:
    """A compaction decided on a history: what to summarize, and how."""

    plan: CompactionPlan
    settings: RunSettings
    history: Sequence[Step]
    tools: list[dict[str, Any]]
    trigger: Trigger
    keep_recent_steps: int
    tokens_before: int
    """The estimate the compaction was decided on."""
    counted_before: int
    """The context before, counted in full: `tokens_before` over it is the scale the
    estimate after is measured in."""
    budget_tokens: int
    """The most transcript tokens its summary request may hold."""

    @classmethod
    def planned(
        cls,
        settings: RunSettings,
        registry: ToolRegistry,
        history: Sequence[Step],
        trigger: Trigger,
        keep_recent_steps: int | None = None,
        *,
        after: Summary | None = None,
    ) -> Compacting | None:
        """The compaction `trigger` calls for on `history`, if any: a threshold only above
        the trigger ratio of the window (`context_window`), an overflow keeping only the
        latest turn, a request keeping `keep_recent_steps` (default: the policy's). `after`
        is the summary just made when this is the next part of a backlog: its estimate after
        is the estimate before, and the budget it was made with holds. None when compaction
        is off or no cut is possible."""
        policy = settings.compaction
        if not policy.enabled and trigger != "request":
            return None
        tools = registry.definitions(settings.tools) + [
            tool.to_openai() for tool in settings.client_tools
        ]
        tokens = token_count_for(settings.model)
        cap = settings.limits.max_history_messages
        if after is not None:
            before = after.tokens_after
        elif cap is None:
            before = tokens.history(settings.instructions, history, tools)
        else:  # the cap drops messages: count what is sent
            before = tokens.prompt(context_steps(settings.instructions, history, cap), tools)
        trigger_tokens = int(context_window(settings) * policy.trigger_ratio)
        if trigger == "threshold" and before <= trigger_tokens:
            return None
        keep = 0 if trigger == "overflow" else policy.keep_recent_steps
        if keep_recent_steps is not None:
            keep = keep_recent_steps
        budget = summary_window(settings) // 2
        if after is not None:
            budget = min(budget, after.budget_tokens)
        plan = plan_compaction(history, keep, budget)
        if plan is None:
            return None
        counted = tokens.counted(context_steps(settings.instructions, history, cap), tools)
        return cls(plan, settings, history, tools, trigger, keep, before, counted, budget)

    def smaller(self, error: ModelError) -> Compacting | None:
        """This compaction on a smaller part, after the provider refused its summary request
        as too long: at most half the refused transcript, or half the window the refusal
        states if less (learned as the summary model's). None when `error` is no such
        refusal, or when not even the first turn is left to cut off."""
        refusal = context_refusal(error)
        if refusal is None:
            return None
        settings = self.settings
        LEARNED_WINDOWS.learn(settings.compaction.model or settings.model, refusal)
        budget = min(self.plan.tokens // 2, summary_window(settings) // 2)
        plan = plan_compaction(self.history, self.keep_recent_steps, budget)
        if plan is None or plan.last_sequence >= self.plan.last_sequence:
            return None
        return replace(self, plan=plan, budget_tokens=budget)

    async def summarize(
        self, driver: ModelDriver, trace: RunTrace, step: Step, sequence: int
    ) -> Summary:
        """`step` (role SUMMARY, its ids set) made the summary of the plan: its content,
        range and the summary call's metrics. Each call is traced under `trace` as producing
        the step at `sequence`. A request refused as too long is made again on a smaller part
        (`smaller`), which the summary then covers; raises what the model driver raises
        (ModelError), the refusal itself when not even the first turn fits."""
        settings = self.settings
        compacting = self

        def ignore(_: ModelEvent) -> None:
            return None

        while True:
            request = summary_request(
                compacting.plan, settings.compaction, settings.model, summary_window(settings)
            )
            try:
                with trace.model_call(request, step.id, sequence) as span:
                    reply = await driver.complete(request, ignore)
                    span.replied(reply)
            except ModelError as error:
                smaller = compacting.smaller(error)
                if smaller is None:
                    raise
                compacting = smaller
                continue
            step.trace_id, step.span_id = span.trace_id, span.span_id
            return compacting._made(step, sequence, reply)

    def _made(self, step: Step, sequence: int, reply: ModelReply) -> Summary:
        """`step` made the summary `reply` holds, with the estimates around it."""
        settings = self.settings
        step.content = reply.content.strip() or "(the summary came back empty)"
        step.metrics = reply.metrics if reply.metrics is not None else StepMetrics()
        step.summary_first_sequence = self.plan.first_sequence
        step.summary_last_sequence = self.plan.last_sequence
        step.sequence = sequence  # as it will be stored: the context after it reads it
        after = context_steps(
            settings.instructions, [*self.history, step], settings.limits.max_history_messages
        )
        step.sequence = 0
        # No report counts the compacted context yet (the summary call's counts what it
        # replaced): its count is scaled as the estimate before was to the count before.
        counted = token_count_for(settings.model).counted(after, self.tools)
        tokens_after = (
            round(counted * self.tokens_before / self.counted_before)
            if self.counted_before
            else counted
        )
        return Summary(step, self.tokens_before, tokens_after, self.trigger, self.budget_tokens)
