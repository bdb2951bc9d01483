import jinja2, json
env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
def raise_exception(m): raise Exception(m)
env.globals['raise_exception'] = raise_exception
T = {}
T['chatml'] = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
T['llama2'] = "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"
T['llama3'] = "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
T['zephyr'] = "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\\n' + message['content'] + eos_token }}\n{% elif message['role'] == 'system' %}\n{{ '<|system|>\\n' + message['content'] + eos_token }}\n{% elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\\n'  + message['content'] + eos_token }}\n{% endif %}\n{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}"
T['qwen_ns'] = "{%- set ns = namespace(found=false) -%}\n{%- for m in messages -%}\n  {%- if m.role == 'system' -%}{%- set ns.found = true -%}{%- endif -%}\n{%- endfor -%}\n{%- if not ns.found -%}\n  {{- '<|im_start|>system\\nYou are Qwen.<|im_end|>\\n' -}}\n{%- endif -%}\n{%- for m in messages -%}\n  {{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}\n{%- endfor -%}\n{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
T['phi3'] = "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') %}{{'<|user|>' + '\n' + message['content'] + '<|end|>' + '\n' + '<|assistant|>' + '\n'}}{% elif (message['role'] == 'assistant') %}{{message['content'] + '<|end|>' + '\n'}}{% endif %}{% endfor %}"
T['misc'] = "{% for m in messages if m.role != 'system' %}{{ loop.index }}/{{ loop.length }}:{{ m.content|upper }}{{ '|' if not loop.last }}{% endfor %} {{ messages|length }} {{ (messages|first).role }} {{ 'a,b'.split(',')|join('+') }} {{ 7 // 2 }} {{ -7 % 3 }} {{ 'x' ~ 1 }} {{ messages[-1]['content'][:2] }} {{ none is none }} {{ undefined_var is defined }} {{ {'k': 1}|tojson }} {{ [1, 'a']|tojson }} {{ 'Ab'.lower() }}{{ ' s '.strip() }}{% for k, v in {'a': 1}.items() %}{{ k }}={{ v }}{% endfor %}"
# A macro, as templates use them to render one message (keyword and default arguments, a filter inside).
T['macro'] = "{%- macro render(m, prefix='') -%}{{ prefix }}<|{{ m.role }}|>\n{{ m.content | trim }}{%- endmacro -%}{% for m in messages %}{{ render(m, prefix='#' if loop.first else '') }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
msgs = {
 'sys_user': [{'role':'system','content':'S'},{'role':'user','content':'Hi'}],
 'conv': [{'role':'system','content':'S'},{'role':'user','content':'Hi'},{'role':'assistant','content':'Yo'},{'role':'user','content':'More'}],
 'user': [{'role':'user','content':' Hi '}],
}
out = []
for name, src in T.items():
  for mname, m in msgs.items():
    for agp in (True, False):
      try:
        r = env.from_string(src).render(messages=m, add_generation_prompt=agp, bos_token='<s>', eos_token='</s>')
      except Exception as e:
        r = 'ERROR: ' + str(e)
      out.append((name, mname, agp, r))
json.dump({'templates': T, 'cases': out}, open('cases.json','w'), indent=1)
for o in out:
  print(o[0], o[1], o[2], repr(o[3])[:150])
