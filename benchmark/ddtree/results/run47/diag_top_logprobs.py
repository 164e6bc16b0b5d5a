"""No-spec float16 server's raw top-12 logprobs after the T0.6_k5_p0.8 prompt + each common
3-token prefix; T=0.6 probabilities and the mass strictly above each token."""

import json
import math
import sys

from sglang_ddtree.testing import law

PREFIXES = [(464, 280, 390), (464, 280, 310), (464, 280, 298), (464, 280, 691), (464, 280, 278)]


def main(out):
    prompts = law.tokenized_prompts()
    names = list(law.law_settings())
    prompt = prompts[names.index("T0.6_k5_p0.8") % len(prompts)]
    res = []
    with law.engine(None, "float16") as eng:
        q = [prompt + list(p) for p in PREFIXES]
        outs = eng.generate(
            input_ids=q,
            sampling_params=[{"temperature": 0.0, "max_new_tokens": 1}] * len(q),
            return_logprob=True,
            top_logprobs_num=12,
        )
        for p, o in zip(PREFIXES, outs):
            lp = [(x[1], x[0]) for x in o["meta_info"]["output_top_logprobs"][0]]
            w = [math.exp(v / 0.6) for _, v in lp]
            # the T=0.6 normalizer over the full vocabulary is unknown from the top 12: use the
            # raw logprobs' own normalization: p_T(x) = exp(lp/T) / sum_y exp(lp_y/T) (top 12 bound)
            z = sum(w)
            cum, rows = 0.0, []
            for (tok, v), wi in zip(lp, w):
                rows.append(
                    {
                        "tok": tok,
                        "raw_lp": round(v, 5),
                        "pT": round(wi / z, 5),
                        "mass_above": round(cum, 5),
                    }
                )
                cum += wi / z
            res.append({"prefix": p, "rows": rows})
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res))


if __name__ == "__main__":
    main(sys.argv[1])
