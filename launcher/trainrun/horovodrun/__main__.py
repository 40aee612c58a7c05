from trainrun.horovodrun import main

main()
