from trainrun.cli import main

main()
