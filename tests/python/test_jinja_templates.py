"""Tandem's Jinja interpreter (common/text/jinja) against jinja2 as transformers calls it.

Renders varied conversations with SmolLM2-135M-Instruct's own chat template (read from its GGUF,
tests/python/smollm2_util.py), with the public chat templates of Llama 3 / 3.1, Qwen2.5,
Mistral, Gemma, Phi-3, DeepSeek and Zephyr (written here from their published forms), with a
template that uses every feature real chat templates use (loop.*, macros, namespace(), slicing,
filters, tojson, raise_exception, whitespace control) and with a list of small expressions; each
rendering must equal jinja2's, and where jinja2 fails Tandem must fail (raise_exception's message
exactly). The C++ side is the hidden Catch2 case [jinja_cases]. Exit 0 = pass, 77 = skip (no
SmolLM2 package).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jinja_util  # noqa: E402
import smollm2_util  # noqa: E402

LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
          "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim "
          "+ '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
          "{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
          "'<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")

LLAMA31 = """{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message + builtin tools #}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\\n" }}
{%- endif %}
{%- if builtin_tools is defined %}
    {{- "Tools: " + builtin_tools | reject('equalto', 'code_interpreter') | join(", ") + "\\n\\n"}}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\\n\\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

QWEN25 = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

MISTRAL = """{%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message["role"] == "user") != (loop.index0 % 2 == 0) %}
        {{- raise_exception("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif %}
    {%- if message["role"] == "user" %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST] " + system_message + "\\n\\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST] " + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif message["role"] == "assistant" %}
        {{- " " + message["content"]|trim + eos_token}}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}
    {%- endif %}
{%- endfor %}
"""

GEMMA = ("{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not "
         "supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != "
         "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
         "user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') %}"
         "{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ "
         "'<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
         "{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}")

PHI3 = ("{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + "
        "message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + "
        "message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' "
        "+ message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ "
        "'<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}")

DEEPSEEK = (
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
    "{% set ns = namespace(is_first=false, is_tool=false, is_output_first=true, system_prompt='') %}"
    "{%- for message in messages %}{%- if message['role'] == 'system' %}{% set ns.system_prompt = "
    "message['content'] %}{%- endif %}{%- endfor %}{{bos_token}}{{ns.system_prompt}}{%- for message in "
    "messages %}{%- if message['role'] == 'user' %}{%- set ns.is_tool = false -%}{{'<｜User｜>' + "
    "message['content']}}{%- endif %}{%- if message['role'] == 'assistant' and message['content'] is "
    "none %}{%- set ns.is_tool = false -%}{%- for tool in message['tool_calls']%}{%- if not "
    "ns.is_first %}{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + "
    "'<｜tool▁sep｜>' + tool['function']['name'] + '\\n' + '```json' + '\\n' + "
    "tool['function']['arguments'] + '\\n' + '```' + '<｜tool▁call▁end｜>'}}{%- set ns.is_first = true "
    "-%}{%- else %}{{'\\n' + '<｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + "
    "tool['function']['name'] + '\\n' + '```json' + '\\n' + tool['function']['arguments'] + '\\n' + "
    "'```' + '<｜tool▁call▁end｜>'}}{{'<｜tool▁calls▁end｜><｜end▁of▁sentence｜>'}}{%- endif %}{%- "
    "endfor %}{%- endif %}{%- if message['role'] == 'assistant' and message['content'] is not none "
    "%}{%- if ns.is_tool %}{{'<｜tool▁outputs▁end｜>' + message['content'] + "
    "'<｜end▁of▁sentence｜>'}}{%- set ns.is_tool = false -%}{%- else %}{% set content = "
    "message['content'] %}{% if '</think>' in content %}{% set content = "
    "content.split('</think>')[-1] %}{% endif %}{{'<｜Assistant｜>' + content + "
    "'<｜end▁of▁sentence｜>'}}{%- endif %}{%- endif %}{%- if message['role'] == 'tool' %}{%- set "
    "ns.is_tool = true -%}{%- if ns.is_output_first %}{{'<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>' "
    "+ message['content'] + '<｜tool▁output▁end｜>'}}{%- set ns.is_output_first = false %}{%- else %}"
    "{{'\\n<｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}{%- endif %}{%- "
    "endif %}{%- endfor -%}{% if ns.is_tool %}{{'<｜tool▁outputs▁end｜>'}}{% endif %}{% if "
    "add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜>'}}{% endif %}")

ZEPHYR = """{% for message in messages %}
{% if message['role'] == 'user' %}
{{ '<|user|>\\n' + message['content'] + eos_token }}
{% elif message['role'] == 'system' %}
{{ '<|system|>\\n' + message['content'] + eos_token }}
{% elif message['role'] == 'assistant' %}
{{ '<|assistant|>\\n'  + message['content'] + eos_token }}
{% endif %}
{% if loop.last and add_generation_prompt %}
{{ '<|assistant|>' }}
{% endif %}
{% endfor %}"""

# Every feature in one template: macros, namespace(), loop.*, slicing, filters, tests, tojson,
# whitespace control in all its forms, comments, content parts.
FEATURES = """{%- macro render_part(part, sep=' ') -%}
  {%- if part is string -%}{{ part }}
  {%- elif part.type == 'text' -%}{{ part.text | trim }}
  {%- else -%}[{{ part.type | upper }}]
  {%- endif -%}
{%- endmacro -%}
{%- set ns = namespace(users=0, last_user=-1, chars=0) -%}
{%- for m in messages -%}
  {%- if m.role == 'user' %}{% set ns.users = ns.users + 1 %}{% set ns.last_user = loop.index0 %}{% endif -%}
  {%- if m.content is string %}{% set ns.chars = ns.chars + m.content | length %}{% endif -%}
{%- endfor -%}
{{ bos_token }}
{%- for m in messages %}
{{ loop.index }}/{{ loop.length }} {{ loop.revindex }} {{ m.role | capitalize }}{% if loop.first %} (first){% endif %}{% if loop.last %} (last){% endif %}
{%- if loop.previtem is defined %} after {{ loop.previtem.role }}{% endif %}
{%- if loop.nextitem is defined %} before {{ loop.nextitem.role }}{% endif %}
{%- if m.name is defined %} named {{ m.name | title }}{% endif %}:
{%- if m.content is string %} {{ m.content[:20] | trim }}{{ '...' if m.content | length > 20 }} [{{ m.content.split() | length }} words, {{ m.content | wordcount }}]
{%- elif m.content is none %} (none)
{%- else %}{% for p in m.content %} {{ render_part(p) }}{{ ',' if not loop.last }}{% endfor %}
{%- endif %}
  {#- a comment that strips #}
  {% if m.role == 'assistant' and m.tool_calls is defined %}
    calls: {{ m.tool_calls | map(attribute='function.name') | join(', ') }}
  {% endif %}
{% endfor %}
users={{ ns.users }} last={{ ns.last_user }} chars={{ ns.chars }} roles={{ messages | map(attribute='role') | unique | list | tojson }}
sorted={{ messages | map(attribute='role') | sort | reverse | list }} {{ (messages | selectattr('role', 'equalto', 'user') | list | length) is divisibleby 2 }}
{{ messages[-1] | tojson(indent=2) }}
{{ messages[::-1] | map(attribute='role') | join('<') }} {{ messages[1:3] | length }} {{ messages | first | tojson(sort_keys=true) }}
{%- if messages | length > 6 %}{{ raise_exception('Conversation too long: ' ~ messages | length ~ ' messages') }}{% endif %}
{%- if add_generation_prompt +%}
<assistant>
{%- endif %}
"""

# Small expressions: one feature each.
SNIPPETS = [
    "{{ [1, 'a', None, True, 1.5, {'k': (1, 2)}] }}",
    "{{ 1e16 }} {{ 1e15 }} {{ 0.0001 }} {{ 0.00001 }} {{ 1.5e300 * 1e10 }} {{ 3|float / 7 }} {{ -0.0 }}",
    "{{ 'it\\'s' }}{{ ['it\\'s', 'a\"b', \"\\n\\x00\u00a0é\"] }}",
    "{{ 2**3**2 }} {{ -2**2 }} {{ 7//-2 }} {{ -7%3 }} {{ 1/2 }} {{ 10/5 }} {{ 10.5 // 3 }} {{ -7.5 % 2 }}",
    "{% for a in [1,2,3] %}{{ loop.previtem }}-{{ loop.nextitem }}-{{ loop.revindex }}{% endfor %}",
    "{{ 'abc'[::-1] }}{{ [1,2,3][1:] }}{{ 'héllo'[1:3] }}{{ 'hello'[-3:-1] }}{{ [1,2,3,4][::2] }}",
    "  {% if true %}\n  x\n  {% endif %}\n  {{ 1 }}  {% if true %}y{% endif %}\n",
    "a\n{# c #}\nb\n  {#- c -#}  \nc {%- if true -%} d {%+ if true %} e{% endif %}\n{% endif %}\n\n",
    "{% raw %}{{ x }}{% endraw %}\n{%- raw -%}  {% y %}  {%- endraw %}z",
    "{{ (1,) }} {{ () }} {{ 1, 2 }}",
    "{{ 3.0|round }} {{ 2.5|round }} {{ 2.567|round(2) }} {{ 2.5|round(0, 'floor') }} {{ 1|float }} {{ '3'|int }}",
    "{{ {'a': 1}.get('b', 2) }}{{ {'a': 1}.get('a') }}{{ 'A b'.title() }}{{ 'a-b c(d'|title }}",
    "{{ 1 == 1.0 }} {{ True == 1 }} {{ [1] == (1,) }} {{ 'a' < 'b' < 'c' }}",
    "{% macro m(a, b=2) %}{{ a }}{{ b }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1) }}{{ m(1, 3, 4, z=5) }}",
    "{% macro f(x) %}[{{ caller() }}{{ x }}]{% endmacro %}{% call f(2) %}body{% endcall %}",
    "{{ raise_exception('boom') if false }}x{{ '%s-%d' % ('a', 3) }}{{ '%.2f' % 3.14159 }}",
    "{{ 'a b  c'.split() }}{{ 'a,b'.split(',') }}{{ 'a,b,c'.split(',', 1) }}{{ 'a b c'.rsplit(None, 1) }}",
    "{{ [3,1,2]|sort }}{{ ['b','A','a']|sort }}{{ ['b','A','a']|unique|list }}{{ ['a','B']|sort(reverse=true) }}",
    "{{ 'abc'|first }}{{ [1,2]|last }}{{ []|first }}|{{ [{'a':2},{'a':1}]|sort(attribute='a') }}",
    "{{ u ~ 'a' }}{{ none ~ 1 }}{{ {'a':1}|items|list }}{{ x|map(attribute='a')|list }}",
    "{% for k, v in {'a': 1}.items() %}{{ k }}{{ v }}{% endfor %}{% for k in {'a': 1, 'b': 2} %}{{ k }}{% endfor %}",
    "{{ 'x' if false }}|{{ ('x' if false) is defined }}|{{ 1 if 0 else 2 if 0 else 3 }}",
    "{{ [1,2,3]|select('odd')|list }}{{ [1,2,3]|reject('odd')|list }}{{ [1,2,3]|sum }}{{ [1,5,3]|max }}{{ ['b','a']|min }}",
    "{{ [{'a':1},{'a':2}]|selectattr('a','equalto',2)|list }}{{ [{'a':1},{}]|rejectattr('a')|list }}",
    "{{ 'a\nb'|indent(2) }}|{{ 'a\n\nb'|indent(2, true) }}|{{ 'a\n\nb'|indent(width='> ', blank=true) }}",
    "{{ x.b[1:] }}{{ x.b[-1] }}{{ x.b[10] }}|{{ 'abc'[5] }}",
    "{{ 'a'.startswith(('a','b')) }}{{ 'abc'.endswith('bc') }}{{ ' x '.strip() }}{{ 'xxaxx'.strip('x') }}{{ '  a'.lstrip() }}{{ 'a  '.rstrip() }}",
    "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set (c, d) = [3, 4] %}{{ c }}{{ d }}",
    "{{ 'ß'.upper() }}{{ 'ÀB'.lower() }}{{ 'hello world'.capitalize() }}{{ 'hEllo'|capitalize }}{{ 'ΣΑΣ'.lower() }}",
    "{{ x|string }}{{ 1|string + 'a' }}{{ '%r' % 'a' }}{{ x.keys()|list }}{{ x.values()|list|length }}",
    "{{ undefined_thing|default('d') }}{{ ''|default('e', true) }}{{ none|default('f') }}{{ none|d('g', true) }}",
    "{% for x in [1,2,3] if x > 1 %}{{ loop.index }}/{{ loop.length }}{% else %}none{% endfor %}",
    "{% for x in [] %}a{% else %}empty{% endfor %}{{ 'a' 'b' }}{{ x.a.upper() }}",
    "{% set ns = namespace(c=0) %}{% for m in [1,2] %}{% set ns.c = ns.c + m %}{% endfor %}{{ ns.c }}",
    "{% set s %}  in {{ 1 }}  {% endset %}[{{ s }}]{% set t | upper %}up{% endset %}{{ t }}",
    "{{ true and 'x' }}{{ 0 or [] }}{{ not 1 }}{{ not 1 == 2 }}{{ 1 in [1] }}{{ 3 not in [1] }}{{ 'a' not in 'abc' }}",
    "{{ 'é'|tojson }}{{ 'é'|tojson(true) }}{{ (1,2)|tojson }}{{ {1:2}|tojson }}{{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }}",
    "{{ {'b': {}, 'a': [], 'c': [1, {'d': none}]}|tojson(indent='\t') }}{{ [1,[2,3]]|tojson(indent=1) }}",
    "{{ x|tojson(separators=(',', ':')) }}{{ '\\u2028\\x1f😀'|tojson }}{{ 1.0|tojson }}{{ 1e20|tojson }}",
    "{% filter upper %}abc{{ 1 }}{% endfilter %}{% with a = 3 %}{{ a }}{% endwith %}{{ a }}",
    "{% for a, b in [(1, 2), (3, 4)] %}{{ a + b }}{% endfor %}",
    "{{ 'abc'.replace('b', 'X') }}{{ 'abc'|replace('', '-') }}{{ 'x'|center(6) }}|{{ 'xy'|center(7) }}|",
    "{{ {'b':1,'a':2}|dictsort }}{{ 'hello world foo'|wordcount }}{{ 'a<b>&\"'|escape }}",
    "{{ [1,2,3,4,5]|batch(2)|list }}{{ -3|abs }}{{ (-3)|abs }}{{ 7 is odd }}{{ 7 is even }}",
    "{{ 'abc' is lower }}{{ 'ABC' is upper }}{{ x.b|reverse|list }}{{ 'abc'|reverse }}",
    "{% for i in range(3) %}{{ loop.cycle('a','b') }}{{ loop.first }}{{ loop.last }}{{ loop.index0 }}{% endfor %}",
    "{% for i in [1,1,2] %}{{ loop.changed(i) }}{% endfor %}{% for i in range(1, 10, 3) %}{{ i }}{% endfor %}",
    "{% set ns = namespace() %}{% set ns.a = 1 %}{{ ns.a }}{{ ns.b is defined }}",
    "{{ '{} and {}'.format(1, 'b') }}{{ '{0}{name}'.format('z', name='q') }}{{ 'Hi %s' | format('x') }}",
    "{{ [1, 2] | join }}{{ [1, 2] | join(', ') }}{{ 3 is sameas 3 }}{{ none is sameas none }}",
    "{{ 1.5e-7 }} {{ 123456789.123 }} {{ 1e22 }} {{ 2.0**70 }} {{ 10**18 }} {{ 2**-2 }}",
    "{{ '\\u00e9\\t\\\\' }}{{ \"a'b\" }}{{ [\"a'b\"] }}{{ ['a\"b\\'c'] }}",
    "{{ 'abc' ~ 1 ~ none ~ [1] }}{{ {'a': 1} == {'a': 1} }}{{ {'a': 1} == {'a': 2} }}",
    "{{ 1 is defined }}{{ none is none }}{{ u is undefined }}{{ [] is sequence }}{{ x is mapping }}{{ 'a' is string }}{{ 1 is integer }}{{ 1.0 is float }}{{ true is boolean }}",
    "{% set t = (1, 2) %}{{ t[0] }}{{ t|list }}{{ [1, 2][5:] }}{{ (1,2,3)[1:] }}{{ x.b|length }}{{ x|length }}",
    "{{ ' \t a \u3000'|trim }}|{{ 'xax'|trim('x') }}{{ 'Hello World'|lower|title }}",
    "{{ 'a' | int }}{{ '0x1f' | int(0, 16) }}{{ '12' | int + 1 }}{{ 3.9|int }}{{ ' 7 '|int }}{{ '1_0'|int }}{{ '2.5'|int }}",
    "{{ 'x'|float }}{{ '1.5'|float }}{{ '3'|float }}{{ [3,2,1]|sort|first }}",
    "{{ x.a.splitlines() }}{{ 'a\\r\\nb\\nc'.splitlines() }}{{ 'abcb'.find('b') }}{{ 'abcb'.rfind('b') }}{{ 'abcb'.count('b') }}",
    "{{ '-'.join(['a', 'b']) }}{{ 'x1'.isalnum() }}{{ '12'.isdigit() }}{{ ' '.isspace() }}{{ 'ab'.isalpha() }}",
    "{{ x.b.index(2.5) }}{{ x.b.count(1) }}{{ [1, 2] + [3] }}{{ (1,) + (2,) }}{{ 'ab' * 2 }}{{ [0] * 3 }}",
    "{% if x.b %}{{ x.b | length }}{% elif x %}no{% else %}neither{% endif %}",
    "{{ messages | length }}{{ messages[0].role if messages }}",
    # errors
    "{{ u.x }}", "{{ d.x.y }}", "{{ 'a' + 1 }}", "{{ u + 1 }}", "{{ 1 < 'a' }}", "{{ foo() }}",
    "{{ 'x'.foo() }}", "{{ 1 / 0 }}", "{{ 5 // 0 }}", "{{ x.b[0:2:0] }}", "{{ [1] + (2,) }}",
    "{{ range(100001)|length }}", "{{ 1 + }}", "{% if %}", "{% for x in y %}", "{% endif %}",
    "{{ x }", "{% foo %}", "{{ 'abc }}", "{% set y = 1 %}{% set y.b = 2 %}",
    "{{ raise_exception('Custom error ' ~ 42) }}", "{% for a, b in [1] %}{% endfor %}",
]


def conversations():
    return [
        [{"role": "user", "content": "Hello!"}],
        [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}],
        [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"},
         {"role": "user", "content": "And 3+3?"}],
        [{"role": "system", "content": "Sys"}, {"role": "user", "content": "a"},
         {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"},
         {"role": "assistant", "content": "d"}],
        [{"role": "user", "content": "  padded with spaces\n\n"}, {"role": "assistant", "content": "\tok \u00a0"}],
        [{"role": "user", "content": "naïve café 日本語 😀 👨‍👩‍👧 привет"}],
        [{"role": "user", "content": "\u3000\u2028ideographic space\x1c\x85"}],
        [{"role": "user", "content": ""}],
        [{"role": "user", "content": "line1\nline2\r\n  code:\n    x = 1\n"},
         {"role": "assistant", "content": "```python\nprint('hi')\n```"}],
        [{"role": "user", "content": "<|im_start|> and [INST] and <|eot_id|> inside {{ x }} {% y %}"}],
        [{"role": "assistant", "content": "assistant first"}],
        [{"role": "user", "content": "u1"}, {"role": "user", "content": "u2"}],
        [{"role": "system", "content": "only system"}],
        [{"role": "user", "content": "x", "name": "alice smith"}, {"role": "tool", "content": "y"}],
        [{"role": "user", "content": [{"type": "text", "text": " part one "}, {"type": "image_url"}]},
         {"role": "assistant", "content": "seen"}],
        [{"role": "user", "content": "Weather in Paris?"},
         {"role": "assistant", "content": None, "tool_calls": [
             {"id": "c1", "type": "function",
              "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
         {"role": "tool", "content": "{\"temp\": 21}"}, {"role": "tool", "content": "sunny"},
         {"role": "assistant", "content": "21 degrees and sunny."}],
        [{"role": "user", "content": "think"}, {"role": "assistant", "content": "<think>hmm</think>The answer"}],
        [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"},
         {"role": "assistant", "content": "d"}, {"role": "user", "content": "e"}, {"role": "assistant", "content": "f"},
         {"role": "user", "content": "g"}],
    ]


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city (°C)",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def main():
    build_dir = os.environ.get("TANDEM_BUILD_DIR")
    if not build_dir:
        print("TANDEM_BUILD_DIR is not set")
        return 1
    try:
        meta = smollm2_util.gguf_metadata()
    except FileNotFoundError as e:
        print(f"SKIP: {e}")
        return 77
    smol = meta["tokenizer.chat_template"]
    tokens = meta["tokenizer.ggml.tokens"]
    smol_bos = tokens[meta["tokenizer.ggml.bos_token_id"]]
    smol_eos = tokens[meta["tokenizer.ggml.eos_token_id"]]

    cases = []
    for conv in conversations():
        for gen in (True, False):
            cases.append(jinja_util.case(smol, conv, gen, smol_bos, smol_eos))
    # The helper the other SmolLM2 tests use renders the same text as jinja_util.
    assert jinja_util.render_jinja2(cases[0]) == ("out", smollm2_util.render_chat(
        conversations()[0], add_generation_prompt=True, meta=meta))
    n_smol = len(cases)

    templates = [("llama3", LLAMA3, "<|begin_of_text|>", "<|eot_id|>"),
                 ("llama3.1", LLAMA31, "<|begin_of_text|>", "<|eot_id|>"),
                 ("qwen2.5", QWEN25, "", "<|im_end|>"), ("mistral", MISTRAL, "<s>", "</s>"),
                 ("gemma", GEMMA, "<bos>", "<eos>"), ("phi3", PHI3, "<s>", "<|endoftext|>"),
                 ("deepseek", DEEPSEEK, "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
                 ("zephyr", ZEPHYR, "<s>", "</s>"), ("features", FEATURES, "<s>", "</s>")]
    for _, template, bos, eos in templates:
        for conv in conversations():
            for gen in (True, False):
                cases.append(jinja_util.case(template, conv, gen, bos, eos))
        # With tools (the templates that take them) and extra kwargs.
        cases.append(jinja_util.case(template, conversations()[2], True, bos, eos, tools=TOOLS))
        cases.append(jinja_util.case(template, conversations()[1], True, bos, eos,
                                     date_string="1 Jan 2025", tools_in_user_message=False))
    x = {"a": "é\n\"<", "b": [1, 2.5, None, True]}
    for snippet in SNIPPETS:
        cases.append(jinja_util.case(snippet, conversations()[2], False, "<s>", "</s>", x=x, d={}))

    bad = jinja_util.compare(build_dir, cases[:n_smol], "SmolLM2 template")
    bad += jinja_util.compare(build_dir, cases[n_smol:], "public templates and features")
    if bad:
        print(f"FAIL: {bad} renderings differ from jinja2")
        return 1
    print(f"PASS: {len(cases)} renderings equal jinja2's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
