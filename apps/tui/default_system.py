"""The system prompt a chat template uses when the conversation has none (shown in the settings)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edge.models.chat_template import ChatTemplate

# markers no template writes itself: where the system and user contents land in the rendered text
_SYSTEM, _USER = "\x00edge-system\x00", "\x00edge-user\x00"


def default_system(template: ChatTemplate | None) -> str | None:
    """The template's own system prompt for a conversation without one: what it renders in the system
    message's place (ChatML templates such as SmolLM2's and Qwen's add one); None when it adds none, for a
    base model, or when the template refuses these shapes."""
    from edge.errors import EdgeError

    if template is None:
        return None
    user = {"role": "user", "content": _USER}
    try:
        with_system = template.render(
            [{"role": "system", "content": _SYSTEM}, user], add_generation_prompt=False
        )
        without = template.render([user], add_generation_prompt=False)
    except EdgeError:
        return None
    head, found, tail = with_system.partition(_SYSTEM)
    # the default sits where the given system prompt would: same text before it and after it, up to the user's
    if not found or len(without) <= len(head) + len(tail):
        return None
    if not (without.startswith(head) and without.endswith(tail)):
        return None
    text = without[len(head) : len(without) - len(tail)].strip()
    return text or None
