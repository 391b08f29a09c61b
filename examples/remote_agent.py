"""A remote agent: any process, any machine. Usage: python remote_agent.py URL [TOKEN] [QUESTION]"""
import sys

import httpx
import openai

url, token = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "none")
question = sys.argv[3] if len(sys.argv) > 3 else "What is 6 * 7?"
gateway = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=600)

episode = gateway.post("/episodes", json={"task": {"question": question}}).raise_for_status().json()
llm = openai.OpenAI(base_url=episode["base_url"], api_key=episode["api_key"], max_retries=0)
messages = [{"role": "user", "content": question}]
answer = llm.chat.completions.create(model="policy", messages=messages).choices[0].message.content
messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": "Only the number, please."}]
final = llm.chat.completions.create(model="policy", messages=messages).choices[0].message.content

eid = episode["episode_id"]
gateway.post(f"/episodes/{eid}/variables", json={"answer": final}).raise_for_status()
gateway.post(f"/episodes/{eid}/rewards", json={"value": 0.1, "source": "format"}).raise_for_status()
done = gateway.post(f"/episodes/{eid}/done", json={"result": final, "reward": float(final.strip() == "42")})
print(done.raise_for_status().json()["status"])
