"""Chat templates written the way each model family renders tools and calls (from the formats'
public descriptions, cut down to what a test needs), and the special tokens their tokenizers
have: shared by the parser and grammar tests and the server test on tiny models."""

from __future__ import annotations

_CHATML_TURNS = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n"
    "{%- if m.tool_calls %}\n{CALLS}{%- else %}\n{{ m.content }}{%- endif %}<|im_end|>\n"
    "{% endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _chatml(tools: str, calls: str) -> str:
    return (
        "{%- if tools %}<|im_start|>system\n"
        + tools
        + "<|im_end|>\n{% endif %}"
        + (_CHATML_TURNS.replace("{CALLS}", calls))
    )


MISTRAL = (
    "{%- if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'user' %}[INST]{{ m.content }}[/INST]"
    "{%- elif m.tool_calls %}{%- for c in m.tool_calls %}"
    "{%- if c.id | length != 9 %}{{ raise_exception('Tool call IDs should be alphanumeric "
    "strings with length 9!') }}{%- endif %}"
    "[TOOL_CALLS]{{ c.function.name }}[ARGS]{{ c.function.arguments | tojson }}"
    "{%- endfor %}</s>"
    "{%- elif m.role == 'tool' %}[TOOL_RESULTS]{{ m.content }}[/TOOL_RESULTS]"
    "{%- else %}{{ m.content }}</s>{%- endif %}{%- endfor %}"
)
"""Mistral's (v11 tokenizers on: `[TOOL_CALLS]name[ARGS]{...}`, 9-character call ids)."""

GRANITE = _chatml(
    "You have access to these tools: {{ tools | tojson }}. To call one, write <|tool_call|> "
    "then a JSON list of calls.",
    "<|tool_call|>{{ m.tool_calls | map(attribute='function') | list | tojson }}",
)

PYTHONIC = _chatml(
    "If you decide to invoke any of the function(s), you MUST put it in the format of "
    "[func_name1(params_name1=params_value1, params_name2=params_value2...), func_name2(params)]"
    "\n{{ tools | tojson }}",
    "[{%- for c in m.tool_calls %}{{ c.function.name }}("
    "{%- for k, v in c.function.arguments.items() %}{{ k }}={{ v | tojson }}"
    "{%- if not loop.last %}, {% endif %}{%- endfor %})"
    "{%- if not loop.last %}, {% endif %}{%- endfor %}]",
)
"""Llama 3.2's pythonic template (vLLM's tool_chat_template_llama3.2_pythonic), in ChatML."""

QWEN3_CODER = _chatml(
    "# Tools\n<tools>{% for t in tools %}\n<function><name>{{ t.function.name }}</name>"
    "</function>{% endfor %}\n</tools>\nIf you choose to call a function ONLY reply in the "
    "following format:\n<tool_call>\n<function=example_function_name>\n"
    "<parameter=example_parameter_1>\nvalue_1\n</parameter>\n</function>\n</tool_call>",
    "{%- for c in m.tool_calls %}<tool_call>\n<function={{ c.function.name }}>\n"
    "{%- for k, v in c.function.arguments.items() %}\n<parameter={{ k }}>\n{{ v }}\n"
    "</parameter>{%- endfor %}\n</function>\n</tool_call>{%- endfor %}",
)

_DS = {
    "calls": "<\uff5ctool\u2581calls\u2581begin\uff5c>",
    "calls_end": "<\uff5ctool\u2581calls\u2581end\uff5c>",
    "call": "<\uff5ctool\u2581call\u2581begin\uff5c>",
    "call_end": "<\uff5ctool\u2581call\u2581end\uff5c>",
    "sep": "<\uff5ctool\u2581sep\uff5c>",
}
DEEPSEEK_V3 = (
    "{%- if tools %}## Tools\n{{ tools | tojson }}\n{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'user' %}<\uff5cUser\uff5c>{{ m.content }}"
    "{%- elif m.tool_calls %}<\uff5cAssistant\uff5c>"
    + _DS["calls"]
    + "{%- for c in m.tool_calls %}"
    + _DS["call"]
    + "function"
    + _DS["sep"]
    + "{{ c.function.name }}\n```json\n"
    "{{ c.function.arguments | tojson }}\n```"
    + _DS["call_end"]
    + "{%- endfor %}"
    + _DS["calls_end"]
    + "<\uff5cend\u2581of\u2581sentence\uff5c>"
    "{%- elif m.role == 'tool' %}<\uff5ctool\u2581output\u2581begin\uff5c>{{ m.content }}"
    "<\uff5ctool\u2581output\u2581end\uff5c>"
    "{%- else %}{{ m.content }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<\uff5cAssistant\uff5c>{% endif %}"
)

OPENAI = (
    "<|start|>system<|message|>You are a helpful assistant.<|end|>"
    "{%- if tools %}<|start|>developer<|message|># Tools\n## functions\nnamespace functions "
    "{\n{%- for t in tools %}\ntype {{ t.function.name }} = (_: "
    "{{ t.function.parameters | tojson }}) => any;{%- endfor %}\n} // namespace functions"
    "<|end|>{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.tool_calls %}{%- for c in m.tool_calls %}<|start|>assistant<|channel|>commentary "
    "to=functions.{{ c.function.name }} <|constrain|>json<|message|>"
    "{{ c.function.arguments | tojson }}<|call|>{%- endfor %}"
    "{%- elif m.role == 'tool' %}<|start|>functions.tool to=assistant<|channel|>commentary"
    "<|message|>{{ m.content }}<|end|>"
    "{%- elif m.role == 'assistant' %}<|start|>assistant<|channel|>final<|message|>"
    "{{ m.content }}<|end|>"
    "{%- else %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}<|start|>assistant{% endif %}"
)
"""gpt-oss's Harmony: tools in the developer message, calls on the commentary channel."""

TEMPLATES = {
    "mistral": MISTRAL,
    "granite": GRANITE,
    "pythonic": PYTHONIC,
    "qwen3_coder": QWEN3_CODER,
    "deepseek_v3": DEEPSEEK_V3,
    "openai": OPENAI,
}

SPECIAL_TOKENS = [
    "[TOOL_CALLS]",
    "[ARGS]",
    "[THINK]",
    "[/THINK]",
    "<|tool_call|>",
    "<|channel|>",
    "<|message|>",
    "<|constrain|>",
    "<|start|>",
    "<|end|>",
    "<|call|>",
    "<|return|>",
    *_DS.values(),
]
"""Control tokens of those families, added as special tokens (as their tokenizers have them)."""
