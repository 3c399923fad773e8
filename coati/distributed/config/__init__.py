"""The config tree and the ways into it: ``tree.py`` assembles each role's section into one frozen ``Config``;
``cli.py`` makes the command line from it (every field a flag); ``trl.py`` maps TRL's ``GRPOConfig`` names onto it;
``colossalchat/`` translates and maps ColossalChat's ``launch_distributed`` keywords."""
