"""The Hugging Face Trainer really run on CPU: a tiny random Llama, 8 training rows (batch 2),
6 steps, an evaluation every 3 steps over 10 rows (a 5-batch bar), the Trainer's default
callbacks (its ProgressCallback draws the bars; disable_tqdm=False). Its output, to a file,
is what tqdm writes there (\\r updates, the evaluation bar one row down).
With ``--evaluate-between``: train, ``evaluate()`` (its prediction bar drawn on its own: no
training bar to nest under, total 5), then train again (a training bar of total 6 again).
usage: run_trainer.py OUTPUT_DIR [--evaluate-between] > trainer.log"""

import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

torch.manual_seed(0)
cfg = LlamaConfig(
    vocab_size=64,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=32,
)
model = LlamaForCausalLM(cfg)


class Rows(torch.utils.data.Dataset):
    def __init__(self, n):
        self.ids = torch.randint(0, 64, (n, 8))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


args = TrainingArguments(
    output_dir=sys.argv[1],
    max_steps=6,
    per_device_train_batch_size=2,
    per_device_eval_batch_size=2,
    eval_strategy="steps",
    eval_steps=3,
    logging_steps=1,
    save_strategy="no",
    report_to=[],
    disable_tqdm=False,
    use_cpu=True,
    dataloader_num_workers=0,
)
trainer = Trainer(model=model, args=args, train_dataset=Rows(8), eval_dataset=Rows(10))
trainer.train()
if "--evaluate-between" in sys.argv[2:]:
    trainer.evaluate()
    trainer.train()
