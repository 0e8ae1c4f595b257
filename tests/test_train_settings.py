

def test_every_training_flag_says_what_it_does_and_its_default():
    from train.finetune import FinetuneSettings
    from train.pretrain import PretrainSettings
    from train.settings import build_parser

    for cls in (FinetuneSettings, PretrainSettings):
        parser = build_parser(cls)
        formatter = parser._get_formatter()
        for action in parser._actions:
            if action.dest == "help":
                continue
            text = formatter._get_help_string(action)
            assert action.help and action.help.strip() and action.help != action.dest.replace("_", " "), (cls.__name__, action.dest)
            assert "(default:" in text, (cls.__name__, action.dest)
