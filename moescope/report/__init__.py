"""Report: run the notebooks with papermill and render each as one offline HTML page."""
