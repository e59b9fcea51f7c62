from launcher.cli.main import main

main()
